import { checkHost, formatChecks } from "../linux/host-check.ts";
import type { SandboxRuntime } from "../runtime.ts";
import { credentialHash } from "./register.ts";
import { type RunnerServer, startRunnerServer } from "./server.ts";
import type { RunnerHostSettings } from "./settings.ts";

// `sandbar runner`: this host's runtime served on the runner port. The runtime is the caller's
// (the CLI opens control's LocalRuntime, the same one `sandbar serve` holds in-process): the
// daemon serves any SandboxRuntime. Sandboxes outlive the process: a restarted runner finds them
// on its disk, and control re-adopts them through it.

export interface Runner {
  server: RunnerServer;
  runnerId: string;
  stop(): Promise<void>;
}

/** What the daemon is given besides its own settings (SANDBAR_RUNNER_*). */
export interface RunnerHostRuntime {
  /** The runner's data dir (<SANDBAR_DATA_DIR>/runner): its credential's hash is kept there. */
  dataDir: string;
  /** The server's version, told to control. */
  version: string;
  /** Opens this host's runtime (called once, after the host checks are logged). */
  openRuntime(): Promise<SandboxRuntime>;
  /** Whether sandboxes mount volumes from a root shared with control (SANDBAR_VOLUME_ROOT). */
  sharedVolumes: boolean;
}

export async function startRunner(o: RunnerHostRuntime, host: RunnerHostSettings, log: (line: string) => void): Promise<Runner> {
  for (const line of formatChecks(await checkHost())) log(`host: ${line}`);
  const runtime = await o.openRuntime();
  const credentialSha256 = await credentialHash(o.dataDir, host, log).catch(async (err: unknown) => {
    await runtime.close();
    throw err;
  });
  const server = await startRunnerServer({
    runtime,
    credentialSha256,
    dataDir: o.dataDir,
    version: o.version,
    host: host.host,
    port: host.port,
    tls: host.tls,
    capacity: { ...host.capacity, gpu: host.gpus.count, gpuType: host.gpus.type },
    sharedVolumes: o.sharedVolumes,
    log,
  });
  return {
    server,
    runnerId: runtime.runnerId,
    async stop() {
      await server.close();
      await runtime.close();
    },
  };
}
