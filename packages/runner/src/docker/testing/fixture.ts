import { randomBytes } from "node:crypto";
import { mkdtemp } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { buildHostUsrRootfs } from "../../linux/rootfs.ts";
import { execAgentBundle } from "../../linux/testing/harness.ts";
import type { ProviderFixture } from "../../testing/provider-contract.ts";
import { DockerProvider, type DockerProviderOptions } from "../provider.ts";
import type { Dockerd } from "./dockerd.ts";

// The docker provider on a test engine, over a scratch data dir and the host-/usr rootfs the
// linux provider's tests use (imported as an image in milliseconds: /usr is bound, not copied).

export async function dockerFixture(engine: Dockerd, options: Partial<DockerProviderOptions> = {}): Promise<ProviderFixture<DockerProvider>> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), "sandbar-docker-")));
  const rootfs = path.join(dataDir, "base-rootfs");
  const baseMounts = await buildHostUsrRootfs(rootfs);
  const agent = await execAgentBundle();
  const uidBase = options.uidBase ?? 1_600_000_000 + randomBytes(2).readUInt16BE() * 1024;
  const open = () => DockerProvider.open({ ...options, socketPath: engine.socketPath, dataDir, uidBase, uidCount: 1024 });
  const provider = await open();
  return {
    provider,
    dataDir,
    rootfs,
    reopen: open,
    initPid: async (id) => {
      const c = await provider.docker.getContainer(provider.containerName(id)).inspect();
      return c.State.Running ? c.State.Pid : undefined;
    },
    spec: (id, over = {}) => ({ id, rootfs, mounts: baseMounts, cpu: 1, memoryGiB: 0.5, pidsLimit: 256, init: { node: process.execPath, bundle: agent }, ...over }),
  };
}
