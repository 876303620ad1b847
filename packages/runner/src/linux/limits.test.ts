import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sleep } from "./cgroups/types.ts";
import type { Fixture } from "./testing/harness.ts";
import { exec, fixture, processesOfUid, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Resource limits enforced by the cgroup and the disk image, observed from the cgroup's counters.

let f: Fixture;
const created: string[] = [];

beforeAll(async () => {
  f = await fixture();
});

afterAll(() => disposeFixture(f, created));

async function started(prefix: string, over: Parameters<Fixture["spec"]>[1]): Promise<string> {
  const id = uniqueId(prefix);
  created.push(id);
  await f.provider.create(f.spec(id, over));
  await f.provider.start(id);
  return id;
}

describe("linux sandbox limits", () => {
  it("OOM-kills a process over the memory limit, reports it, and the sandbox lives on", async () => {
    const id = await started("oom", { memoryGiB: 0.25 });
    const before = await f.provider.inspect(id);
    expect(before.usage?.memoryLimitBytes).toBe(256 * 2 ** 20);
    expect(before.usage?.oomKills).toBe(0);
    const res = await exec(f.provider, id, ["/opt/sandbar/bin/node", "-e", "const a = []; for (;;) a.push(Buffer.alloc(16 << 20, 1));"]);
    expect(res.signal).toBe("SIGKILL");
    const after = await f.provider.inspect(id);
    expect(after.state).toBe("started");
    expect(after.usage?.oomKills).toBeGreaterThanOrEqual(1);
    expect(after.usage?.memoryPeakBytes).toBeLessThanOrEqual(256 * 2 ** 20);
    // The agent survived: the sandbox still answers.
    expect((await sh(f.provider, id, "echo alive")).stdout).toBe("alive\n");
  });

  it("stops a fork bomb at the pids limit without touching the host", async () => {
    const id = await started("forkbomb", { pidsLimit: 32 });
    const { hostUid } = await f.provider.inspect(id);
    await sh(f.provider, id, "exec >/dev/null 2>&1 </dev/null; b() { b | b & }; b");
    let info = await f.provider.inspect(id);
    for (let i = 0; i < 100 && (info.usage?.pidsLimitHits ?? 0) === 0; i++) {
      await sleep(20);
      info = await f.provider.inspect(id);
    }
    expect(info.usage?.pidsLimitHits).toBeGreaterThan(0);
    expect(info.usage?.pids).toBeLessThanOrEqual(32);
    expect((await processesOfUid(hostUid)).length).toBeLessThanOrEqual(32);
    // The host can still fork, and stop kills the bomb entirely.
    const stopped = await f.provider.stop(id, { force: true });
    expect(stopped.state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
  });

  it("throttles CPU to the quota (cpu.stat nr_throttled and throttled time grow)", async () => {
    const id = await started("cpu", { cpu: 0.1 });
    const before = (await f.provider.inspect(id)).usage!;
    const t0 = Date.now();
    const res = await exec(f.provider, id, ["/opt/sandbar/bin/node", "-e", "const end = Date.now() + 1500; while (Date.now() < end);"]);
    const wall = Date.now() - t0;
    expect(res.code).toBe(0);
    const after = (await f.provider.inspect(id)).usage!;
    expect(after.cpuThrottledPeriods - before.cpuThrottledPeriods).toBeGreaterThan(5);
    expect(after.cpuThrottledUsec).toBeGreaterThan(before.cpuThrottledUsec);
    // ~0.1 cores over the busy loop (plus node's start-up), far from the full core it asked for.
    const used = (after.cpuUsageUsec! - before.cpuUsageUsec!) / 1000;
    expect(used).toBeLessThan(wall * 0.35);
  });

  it("nproc shows the CPU quota (rounded up), not the host's CPUs; the sandbox's own env still wins", async () => {
    const id = await started("nproc", { cpu: 0.5 });
    expect((await sh(f.provider, id, "nproc; echo $OMP_NUM_THREADS")).stdout).toBe("1\n1\n");
    const own = await started("nproc-env", { cpu: 0.5, env: { OMP_NUM_THREADS: "3" } });
    expect((await sh(f.provider, own, "nproc")).stdout).toBe("3\n");
  });

  it("caps the writable layer: ENOSPC at the disk limit, base and host untouched", async () => {
    const id = await started("disk", { diskGiB: 64 / 1024 });
    const res = await sh(f.provider, id, "head -c 200M /dev/zero > ~/fill; echo rc=$?; df -m / | tail -1");
    expect(res.stderr).toContain("No space left on device");
    expect(res.stdout).toContain("rc=1");
    const sizeMb = Number(res.stdout.trim().split("\n")[1].split(/\s+/)[1]);
    expect(sizeMb).toBeGreaterThan(40);
    expect(sizeMb).toBeLessThanOrEqual(64);
    // Free the space and the sandbox can write again.
    const again = await sh(f.provider, id, "rm ~/fill && echo ok > ~/small && cat ~/small");
    expect(again.stdout).toBe("ok\n");
    // The upper layer lives on the loop-mounted image, not in the data dir's filesystem.
    const mountinfo = await readFile("/proc/self/mountinfo", "utf8");
    expect(mountinfo).toContain(` ${f.provider.layout.diskMount(id)} `);
  });
});
