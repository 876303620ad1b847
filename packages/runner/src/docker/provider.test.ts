import { existsSync } from "node:fs";
import { mkdir, readdir } from "node:fs/promises";
import path from "node:path";
import { Code } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { retry, sh, uniqueId } from "../linux/testing/harness.ts";
import { expectCode, type ProviderFixture } from "../testing/provider-contract.ts";
import { DockerProvider } from "./provider.ts";
import { dockerdUnavailable, sharedDockerd } from "./testing/dockerd.ts";
import { dockerFixture } from "./testing/fixture.ts";
import { disposeFixture } from "../testing/dispose.ts";

// What only the docker provider has to get right (the shared cases are in provider-contract.ts):
// the engine's containers against its records after crashes and outside interference, and the
// host writes it makes into a container's writable layer, which the sandbox controls.

const skip = dockerdUnavailable();
if (skip) console.log(`docker provider suite skipped: ${skip}`);

describe.skipIf(skip !== undefined)("docker provider", () => {
  let f: ProviderFixture<DockerProvider>;
  const ids = new Set<string>();
  const make = async (prefix: string, over: Parameters<ProviderFixture["spec"]>[1] = {}, start = true) => {
    const id = uniqueId(prefix);
    ids.add(id);
    await f.provider.create(f.spec(id, over));
    if (start) await f.provider.start(id);
    return id;
  };
  const container = (id: string) => f.provider.docker.getContainer(f.provider.containerName(id));

  beforeAll(async () => {
    f = await dockerFixture(await sharedDockerd(inject("dockerdDir")));
  });

  afterAll(() => disposeFixture(f, ids));

  it("limits the container as the spec says: cpu, memory without swap, pids, no capabilities, no network", async () => {
    const id = await make("shape", { cpu: 0.5, memoryGiB: 0.25, pidsLimit: 100 });
    const c = await container(id).inspect();
    expect(c.HostConfig).toMatchObject({ NanoCpus: 500_000_000, Memory: 2 ** 28, MemorySwap: 2 ** 28, PidsLimit: 100, CapDrop: ["ALL"], NetworkMode: "none", SecurityOpt: ["no-new-privileges"] });
    expect(c.Config.User).toBe(`${(await f.provider.inspect(id)).hostUid}:${(await f.provider.inspect(id)).hostUid}`);
    const usage = (await f.provider.inspect(id)).usage!;
    expect(usage.memoryLimitBytes).toBe(2 ** 28);
    expect(usage.pidsLimit).toBe(100);
  });

  it("refuses a runtime the engine lacks, and egress under gVisor, with the reason", async () => {
    const socketPath = (await sharedDockerd(inject("dockerdDir"))).socketPath;
    await expectCode(DockerProvider.open({ dataDir: f.dataDir, socketPath, runtime: "kata" }), Code.FailedPrecondition, "has no runtime kata");
    await expectCode(DockerProvider.open({ dataDir: f.dataDir, socketPath: "/nonexistent/docker.sock" }), Code.FailedPrecondition, "does not answer");
    if (!(await sharedDockerd(inject("dockerdDir"))).runsc) return;
    const gvisor = await DockerProvider.open({ dataDir: f.dataDir, socketPath, runtime: "runsc", uidBase: 1_690_700_000, uidCount: 16 });
    await expectCode(gvisor.create(f.spec(uniqueId("gv"), { network: "full" })), Code.FailedPrecondition, "not available with the runsc runtime");
  });

  it("a container left by a crash before its record was written does not block a create of the same id", async () => {
    const id = uniqueId("orphan");
    ids.add(id);
    const image = (await f.provider.docker.listImages()).find((i) => (i.RepoTags ?? []).some((t) => t.startsWith("sandbar-rootfs:")))!.RepoTags![0]!;
    await f.provider.docker.createContainer({ name: f.provider.containerName(id), Image: image, Cmd: ["/bin/true"] });
    await f.provider.create(f.spec(id));
    expect((await f.provider.start(id)).state).toBe("started");
    expect((await sh(f.provider, id, "echo ok")).stdout).toBe("ok\n");
  });

  it("a container removed outside Sandbar: the sandbox reports error, start says why, destroy cleans up", async () => {
    const id = await make("gone");
    await container(id).remove({ force: true });
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("error");
    expect(info.error).toContain("container is gone");
    await expectCode(f.provider.start(id), Code.FailedPrecondition, "container is gone");
    await f.provider.destroy(id);
    ids.delete(id);
    await expectCode(f.provider.inspect(id), Code.NotFound);
    expect(existsSync(f.provider.layout.sandboxDir(id))).toBe(false);
    expect(existsSync(f.provider.layout.runtime(id))).toBe(false);
  });

  it("never writes through a link the sandbox planted in its layer (its passwd, its home) to a host path", async () => {
    for (const plant of [(t: string) => `rm /etc/passwd && ln -s ${t}/passwd /etc/passwd`, (t: string) => `cd / && mv /root /root.old && ln -s ${t} /root`]) {
      const target = path.join(f.dataDir, `host-dir-${uniqueId("t")}`);
      await mkdir(target);
      const id = await make("plant", { user: "root" });
      expect((await sh(f.provider, id, `${plant(target)} && echo planted`)).stdout).toBe("planted\n");
      await f.provider.stop(id);
      await expectCode(f.provider.start(id), Code.FailedPrecondition, "sandbox's");
      expect(await readdir(target)).toEqual([]);
      expect((await f.provider.inspect(id)).state).toBe("stopped");
    }
  });

  it("a fork storm at the pids limit: the agent survives it and answers again once it ends (no reserve for the agent here)", async () => {
    const id = await make("fork", { pidsLimit: 128 });
    // Forks as fast as it can for 6 s, each child lingering 3 s: the container stays at its limit.
    const storm = "import os, time\nend = time.time() + 6\nwhile time.time() < end:\n    try:\n        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n    except OSError:\n        time.sleep(0.001)\n";
    await sh(f.provider, id, `setsid python3 -c '${storm}' >/dev/null 2>&1 < /dev/null &`);
    const t0 = Date.now();
    let hits = 0;
    while (hits === 0 && Date.now() - t0 < 5000) hits = (await f.provider.inspect(id)).usage?.pidsLimitHits ?? 0;
    expect(hits).toBeGreaterThan(0);
    // During the storm the agent still runs (it cannot start processes: the limit is the container's).
    expect((await f.provider.inspect(id)).agent?.running).toBe(true);
    expect((await retry(() => sh(f.provider, id, "echo alive").then((r) => (r.stdout === "alive\n" ? r : Promise.reject(new Error(r.stderr)))), 20_000)).stdout).toBe("alive\n");
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("started");
    expect(info.agent).toMatchObject({ running: true, restarts: 0 });
    expect(info.usage!.pids).toBeLessThanOrEqual(128);
  });

  it("destroy removes the container and everything on the host; stop and destroy again are fine", async () => {
    const id = await make("clean");
    await f.provider.stop(id);
    await f.provider.stop(id);
    await f.provider.destroy(id);
    ids.delete(id);
    await expect(container(id).inspect()).rejects.toMatchObject({ statusCode: 404 });
    expect(existsSync(f.provider.layout.sandboxDir(id))).toBe(false);
    expect(existsSync(f.provider.layout.runtime(id))).toBe(false);
    await f.provider.destroy(id);
  });
});
