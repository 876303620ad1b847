import { Code, ConnectError } from "@sandbar/protocol";
import type { BuildInfoRecord } from "./build-info.ts";
import { Builder } from "./builder.ts";
import { BuildLog } from "../snapshots/pulls.ts";

// The builds of sandboxes created with buildInfo: each runs through the shared builder (so a
// sandbox and a snapshot of the same build, or two sandboxes, build once) with its own log,
// followed by GET /sandbox/{id}/build-logs. Logs are kept in memory (the last few hundred
// sandboxes' builds); after a restart a sandbox's build log reads empty. Another control process
// follows a running build from the sandbox's runner, which keeps the build's log by its key.

const KEEP = 200;

/** A build's log on a runner by its build key (GetSnapshotLogs). */
export type RunnerLogs = (runnerId: string, ref: string, follow: boolean, signal: AbortSignal) => AsyncIterable<{ data: Uint8Array }>;

export class SandboxBuilds {
  readonly #builder: Builder;
  readonly #logs = new Map<string, BuildLog>();
  readonly #abort = new AbortController();
  readonly #runnerLogs: RunnerLogs | undefined;

  constructor(builder: Builder, runnerLogs?: RunnerLogs) {
    this.#builder = builder;
    this.#runnerLogs = runnerLogs;
  }

  /** A build this process does not run, followed on the sandbox's runner; nothing when the runner has no such build. */
  async *fromRunner(organizationId: string, info: BuildInfoRecord, runnerId: string, follow: boolean, signal: AbortSignal): AsyncGenerator<{ data: Uint8Array }> {
    if (!this.#runnerLogs) return;
    let sent = false;
    try {
      for await (const chunk of this.#runnerLogs(runnerId, Builder.key(organizationId, info), follow, signal)) {
        sent = true;
        yield { data: chunk.data };
      }
    } catch (err) {
      // Built elsewhere (joined another build), the runner restarted, or a runner only its own process reaches.
      if (sent || !(err instanceof ConnectError && (err.code === Code.NotFound || err.code === Code.Unavailable))) throw err;
    }
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
