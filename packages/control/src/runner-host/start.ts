import path from "node:path";
import { checkHost, formatChecks } from "@sandbar/runner/linux";
import type { Settings } from "../settings.ts";
import { openLocalRuntime } from "../sandboxes/boot.ts";
import { HostDiskVolumes } from "../volumes/storage.ts";
import { type RunnerServer, startRunnerServer } from "./server.ts";
import type { RunnerHostSettings } from "./settings.ts";
import { credentialHash } from "./register.ts";

// `sandbar runner`: this host's runtime (the same LocalRuntime `sandbar serve` holds in-process)
// served on the runner port. Sandboxes outlive the process: a restarted runner finds them on its
// disk, and control re-adopts them through it.

export interface Runner {
  server: RunnerServer;
  runnerId: string;
  stop(): Promise<void>;
}

export async function startRunner(settings: Settings, host: RunnerHostSettings, log: (line: string) => void): Promise<Runner> {
  for (const line of formatChecks(await checkHost())) log(`host: ${line}`);
  // Volumes only from a root shared with control and the region's other runners (SANDBAR_VOLUME_ROOT).
  const volumes = settings.volumeRoot ? new HostDiskVolumes(settings.volumeRoot) : undefined;
  const runtime = await openLocalRuntime(settings, volumes, log);
  const credentialSha256 = await credentialHash(path.join(settings.dataDir, "runner"), host, log).catch(async (err: unknown) => {
    await runtime.close();
    throw err;
  });
  const server = await startRunnerServer({
    runtime,
    credentialSha256,
    dataDir: path.join(settings.dataDir, "runner"),
    version: settings.version,
    host: host.host,
    port: host.port,
    tls: host.tls,
    capacity: { ...host.capacity, gpu: host.gpus.count, gpuType: host.gpus.type },
    sharedVolumes: !!volumes,
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
