import type { MikroORM } from "@mikro-orm/postgresql";
import type { SecretBox } from "../auth/secret-box.ts";
import { webhookService } from "./service.ts";
import type { WebhookSettings } from "./settings.ts";
import { WebhookWorker } from "./worker.ts";

export { recordEvent } from "./events.ts";

/** Webhooks of this control process: the API's service and the delivery worker. */
export async function startWebhooks(orm: MikroORM, box: SecretBox, settings: WebhookSettings, databaseUrl: string, log: (line: string) => void) {
  const worker = new WebhookWorker(orm, box, settings, log);
  await worker.start(databaseUrl);
  return { impl: webhookService(orm, box, settings), worker, stop: () => worker.stop() };
}
