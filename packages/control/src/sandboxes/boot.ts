import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import type { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import path from "node:path";
import { checkHost, formatChecks } from "@sandbar/runner/linux";
import type { Settings } from "../settings.ts";
import { agentInit, LocalRuntime } from "./local-runtime.ts";
import type { SandboxManager } from "./manager.ts";
import { reconcile } from "./reconcile.ts";
import { type SandboxRuntime, unavailableRuntime } from "./runtime.ts";
import { sandboxServices } from "./service.ts";
import { SandboxTimers } from "./timers.ts";

// Sandboxes in a control process: the runtime of this host, the manager, reconciliation with
// what the host holds, then the timers. Without root (or bubblewrap) the server still runs and
// every sandbox call answers 503 with the reason.

export interface Sandboxes {
  impl: Partial<ServiceImpl<typeof SandboxService>>;
  manager: SandboxManager;
  runtime: SandboxRuntime;
  timers: SandboxTimers;
  /** Stops the timers, lets running operations finish; sandboxes keep running. */
  stop(): Promise<void>;
}

export async function startSandboxes(settings: Settings, orm: MikroORM, log: (line: string) => void): Promise<Sandboxes> {
  let runtime: SandboxRuntime;
  for (const line of formatChecks(await checkHost())) log(`host: ${line}`);
  try {
    runtime = await LocalRuntime.open({
      dataDir: path.join(settings.dataDir, "runner"),
      snapshotCacheDir: settings.snapshotCacheDir,
      init: await agentInit(settings.agentBundle),
      log,
    });
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    log(`sandboxes are unavailable: ${reason}`);
    runtime = unavailableRuntime(reason);
  }
  const { impl, manager } = sandboxServices({ orm, settings, runtime, log });
  // A host that cannot be listed is logged, not fatal: the API still serves, and says why calls fail.
  await reconcile(manager, log).catch((err: unknown) => log(`reconcile failed: ${err instanceof Error ? err.message : String(err)}`));
  const timers = new SandboxTimers(manager, { minuteMs: settings.timerMinuteMs, tickMs: settings.timerTickMs, log });
  timers.start();
  return {
    impl,
    manager,
    runtime,
    timers,
    async stop() {
      await timers.stop();
      await manager.close();
      await runtime.close();
    },
  };
}
