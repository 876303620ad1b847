import type { BuildInfoRecord } from "./build-info.ts";
import type { Builder } from "./builder.ts";
import { BuildLog } from "../snapshots/pulls.ts";

// The builds of sandboxes created with buildInfo: each runs through the shared builder (so a
// sandbox and a snapshot of the same build, or two sandboxes, build once) with its own log,
// followed by GET /sandbox/{id}/build-logs. Logs are kept in memory (the last few hundred
// sandboxes' builds); after a restart a sandbox's build log reads empty.

const KEEP = 200;

export class SandboxBuilds {
  readonly #builder: Builder;
  readonly #logs = new Map<string, BuildLog>();
  readonly #abort = new AbortController();

  constructor(builder: Builder) {
    this.#builder = builder;
  }

  /** Builds for sandbox `sandboxId` on the runner it was placed on; answers the image's manifest digest. */
  async run(organizationId: string, info: BuildInfoRecord, sandboxId: string, runnerId: string): Promise<string> {
    const log = new BuildLog();
    this.#logs.set(sandboxId, log);
    for (const old of this.#logs.keys()) {
      if (this.#logs.size <= KEEP) break;
      this.#logs.delete(old);
    }
    try {
      const image = await this.#builder.build(organizationId, info, { signal: this.#abort.signal, onProgress: (l) => log.push(l), where: { runnerId } });
      log.push(`image ${image.digest} ready`);
      return image.digest;
    } catch (err) {
      log.push(`error: ${err instanceof Error ? err.message : String(err)}`);
      throw err;
    } finally {
      log.end();
    }
  }

  log(sandboxId: string): BuildLog | undefined {
    return this.#logs.get(sandboxId);
  }

  /** Interrupts running builds (the server is stopping). */
  close(): void {
    this.#abort.abort();
  }
}
