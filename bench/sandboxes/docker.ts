import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { DockerProvider } from "../../packages/runner/src/docker/provider.ts";
import { startDockerd, stopDockerd } from "../../packages/runner/src/docker/testing/dockerd.ts";
import { execAgentBundle, sh } from "../../packages/runner/src/linux/testing/harness.ts";

// The Docker rows of bench/sandboxes: an engine (the host's when `docker info` answers, else one
// started the way the tests start theirs), the default snapshot's rootfs imported into it, and two
// figures over that same image: `docker run --rm --network none <image> true`, and the docker
// provider's create → start → first exec with the exec agent (what floor/node is to the linux
// provider: the provider's own cost, no control plane).

const run = promisify(execFile);

export interface BenchEngine {
  /** Where the engine came from, for the report. */
  origin: string;
  /** The default snapshot's rootfs as an image of the engine. */
  image: string;
  dockerRun(): Promise<number>;
  providerTti(i: number): Promise<number>;
  close(): Promise<void>;
}

export async function benchEngine(rootfs: string, log: (line: string) => void): Promise<BenchEngine> {
  let socketPath = "/var/run/docker.sock";
  let started: string | undefined;
  let origin = "the host's engine";
  try {
    await run("docker", ["-H", `unix://${socketPath}`, "info", "--format", "{{.ServerVersion}}"], { timeout: 10_000 });
  } catch {
    const engine = await startDockerd();
    socketPath = engine.socketPath;
    started = engine.dir;
    origin = "dockerd started by the bench (packages/runner/src/docker/testing/dockerd.ts: own data root, overlay2, no bridge)";
  }
  const dataDir = await mkdtemp(path.join("/var/tmp", "sandbar-bench-docker-"));
  const provider = await DockerProvider.open({ dataDir, socketPath, uidBase: 1_690_600_000, uidCount: 1024 });
  const agent = await execAgentBundle();
  const spec = (id: string) => ({ id, rootfs, cpu: 1, memoryGiB: 1, pidsLimit: 512, init: { node: process.execPath, bundle: agent } });
  // The first create imports the snapshot (once per engine); untimed.
  const t = performance.now();
  await provider.create(spec("bench-warmup"));
  await provider.destroy("bench-warmup");
  log(`docker: snapshot imported in ${((performance.now() - t) / 1000).toFixed(1)} s (${origin})`);
  const image = (await provider.docker.listImages()).flatMap((i) => i.RepoTags ?? []).find((t) => t.startsWith("sandbar-rootfs:"))!;
  return {
    origin,
    image,
    async dockerRun() {
      const t0 = performance.now();
      await run("docker", ["-H", `unix://${socketPath}`, "run", "--rm", "--network", "none", image, "true"], { timeout: 60_000 });
      return performance.now() - t0;
    },
    async providerTti(i) {
      const id = `bench-${process.pid}-${i}`;
      const t0 = performance.now();
      await provider.create(spec(id));
      await provider.start(id);
      const r = await sh(provider, id, "true");
      const t = performance.now() - t0;
      if (r.code !== 0) throw new Error(`exec in a docker sandbox exited ${r.code}: ${r.stderr}`);
      await provider.destroy(id);
      return t;
    },
    async close() {
      await rm(dataDir, { recursive: true, force: true });
      if (started) await stopDockerd(started);
      else await provider.docker.getImage(image).remove().catch(() => undefined);
    },
  };
}
