import { mkdir, mkdtemp, readFile, rm, rmdir, unlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CgroupV2 } from "./v2.ts";

// This machine kind has no v2 controllers (only hugetlb sits on its cgroup2 mount), so the v2
// back end runs against a fake cgroupfs: a directory whose files play the kernel's part.

let root: string;
let base: string;

beforeEach(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "sandbar-fake-cgroup2-"));
  base = path.join(root, "system.slice", "sandbar.service");
  await mkdir(base, { recursive: true });
  await writeFile(path.join(base, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n");
  await writeFile(path.join(base, "cgroup.subtree_control"), "\n");
  await writeFile(path.join(base, "cgroup.procs"), "");
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

const read = (...p: string[]) => readFile(path.join(...p), "utf8");

describe("cgroup v2 back end", () => {
  it("enables memory, pids and cpu down to the sandbox groups", async () => {
    const cg = new CgroupV2({ base, group: "sandbar-test" });
    await cg.prepare();
    expect(await read(base, "cgroup.subtree_control")).toBe("+memory +pids +cpu");
    expect(await read(base, "sandbar-test", "cgroup.subtree_control")).toBe("+memory +pids +cpu");
  });

  it("refuses a hierarchy without the controllers it needs", async () => {
    await writeFile(path.join(base, "cgroup.controllers"), "cpuset hugetlb\n");
    await expect(new CgroupV2({ base, group: "g" }).prepare()).rejects.toThrow(/lacks the memory, pids, cpu controller/);
  });

  it("writes memory.max, memory.swap.max, pids.max and cpu.max", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    const dir = path.join(base, "g", "sbx1");
    await mkdir(dir, { recursive: true });
    await writeFile(path.join(dir, "memory.swap.max"), "max\n"); // the kernel offers it when swap accounting exists
    await cg.create("sbx1", { memoryBytes: 256 * 2 ** 20, pidsMax: 64, cpuQuotaUs: 50_000, cpuPeriodUs: 100_000 });
    expect(await read(dir, "memory.max")).toBe(String(256 * 2 ** 20));
    expect(await read(dir, "memory.swap.max")).toBe("0");
    expect(await read(dir, "pids.max")).toBe("64");
    expect(await read(dir, "cpu.max")).toBe("50000 100000");
    expect(cg.procsFiles("sbx1")).toEqual([path.join(dir, "agent", "cgroup.procs")]);
    expect(cg.userProcsFiles("sbx1")).toEqual([path.join(dir, "user", "cgroup.procs")]);
    expect(cg.paths("sbx1")).toEqual([dir]);
  });

  it("create on an existing group resets its limits (how a running sandbox is resized)", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    const dir = path.join(base, "g", "grow");
    await cg.create("grow", { memoryBytes: 2 ** 30, pidsMax: 64, cpuQuotaUs: 100_000, cpuPeriodUs: 100_000 }, { memoryBytes: 2 ** 30 - 64 * 2 ** 20, pidsMax: 32 });
    await writeFile(path.join(dir, "agent", "cgroup.procs"), "4242\n"); // the sandbox runs
    await cg.create("grow", { memoryBytes: 2 * 2 ** 30, pidsMax: 64, cpuQuotaUs: 200_000, cpuPeriodUs: 100_000 }, { memoryBytes: 2 * 2 ** 30 - 64 * 2 ** 20, pidsMax: 32 });
    expect(await read(dir, "memory.max")).toBe(String(2 * 2 ** 30));
    expect(await read(dir, "cpu.max")).toBe("200000 100000");
    expect(await read(dir, "user", "memory.max")).toBe(String(2 * 2 ** 30 - 64 * 2 ** 20));
    expect(await read(dir, "agent", "cgroup.procs")).toBe("4242\n");
  });

  it("splits a sandbox group into an agent leaf and a user leaf with the user's own budget", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    const dir = path.join(base, "g", "split");
    await mkdir(path.join(dir, "user"), { recursive: true });
    await writeFile(path.join(dir, "user", "cgroup.procs"), "");
    await writeFile(path.join(dir, "cgroup.procs"), "");
    await cg.create("split", { memoryBytes: 256 * 2 ** 20, pidsMax: 128, cpuQuotaUs: 50_000, cpuPeriodUs: 100_000 }, { memoryBytes: 192 * 2 ** 20, pidsMax: 64 }, 4242);
    expect(await read(dir, "cgroup.subtree_control")).toBe("+memory +pids +cpu");
    expect(await read(dir, "memory.max")).toBe(String(256 * 2 ** 20));
    expect(await read(dir, "user", "memory.max")).toBe(String(192 * 2 ** 20));
    expect(await read(dir, "user", "pids.max")).toBe("64");
    // The sandbox uid may move processes into the user leaf (v2 checks the common ancestor too).
    const { stat } = await import("node:fs/promises");
    expect((await stat(path.join(dir, "user", "cgroup.procs"))).uid).toBe(4242);
    expect((await stat(path.join(dir, "cgroup.procs"))).uid).toBe(4242);
    expect((await stat(path.join(dir, "user", "memory.max"))).uid).toBe(0);
    // Counters over the leaves: the larger of the group's own and the sum of its leaves'.
    await mkdir(path.join(dir, "agent"), { recursive: true });
    await writeFile(path.join(dir, "memory.events"), "oom_kill 0\n");
    await writeFile(path.join(dir, "user", "memory.events"), "oom_kill 3\n");
    await writeFile(path.join(dir, "agent", "memory.events"), "oom_kill 1\n");
    await writeFile(path.join(dir, "pids.events"), "max 9\n");
    await writeFile(path.join(dir, "user", "pids.events"), "max 9\n");
    expect(await cg.stats("split")).toMatchObject({ oomKills: 4, pidsLimitHits: 9 });
    await writeFile(path.join(dir, "user", "cgroup.procs"), "7\n8\n");
    await writeFile(path.join(dir, "agent", "cgroup.procs"), "5\n");
    expect((await cg.pids("split")).sort()).toEqual([5, 7, 8]);
    expect(await cg.agentPids("split")).toEqual([5]);
  });

  it("reads OOM kills, pids-limit hits and CPU throttling from the kernel's counters", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    await cg.create("s", { memoryBytes: 1 << 26, pidsMax: 10, cpuQuotaUs: 10_000, cpuPeriodUs: 100_000 });
    const dir = path.join(base, "g", "s");
    await writeFile(path.join(dir, "memory.current"), "1048576\n");
    await writeFile(path.join(dir, "memory.peak"), "67108864\n");
    await writeFile(path.join(dir, "memory.events"), "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n");
    await writeFile(path.join(dir, "pids.current"), "7\n");
    await writeFile(path.join(dir, "pids.events"), "max 31\n");
    // The user leaf at its own limit (the sandbox's is 10 too: no user limits given).
    await writeFile(path.join(dir, "user", "pids.current"), "10\n");
    await writeFile(path.join(dir, "cpu.stat"), "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 40\nnr_throttled 17\nthrottled_usec 890000\n");
    await writeFile(path.join(dir, "cgroup.procs"), "101\n102\n");
    expect(await cg.stats("s")).toEqual({
      memoryBytes: 1048576,
      memoryPeakBytes: 67108864,
      memoryLimitBytes: 1 << 26,
      oomKills: 2,
      pids: 7,
      pidsLimit: 10,
      pidsLimitHits: 31,
      pidsSaturated: true,
      cpuUsageUsec: 123456,
      cpuPeriods: 40,
      cpuThrottledPeriods: 17,
      cpuThrottledUsec: 890000,
    });
    expect(await cg.pids("s")).toEqual([101, 102]);
    expect(await cg.stats("missing")).toBeUndefined();
    expect(await cg.pids("missing")).toEqual([]);
  });

  it("kills through cgroup.kill and removes the group", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    await cg.create("k", { memoryBytes: 1 << 26, pidsMax: 10, cpuQuotaUs: 10_000, cpuPeriodUs: 100_000 });
    const dir = path.join(base, "g", "k");
    await writeFile(path.join(dir, "cgroup.kill"), "");
    await writeFile(path.join(dir, "cgroup.procs"), ""); // the kernel empties it once the kill is done
    await cg.kill("k");
    expect(await read(dir, "cgroup.kill")).toBe("1");
    // A real cgroupfs removes its interface files with the directory; the fake needs help.
    const { readdir } = await import("node:fs/promises");
    const clear = async (d: string) => {
      for (const e of await readdir(d, { withFileTypes: true })) {
        if (e.isDirectory()) {
          await clear(path.join(d, e.name));
          await rmdir(path.join(d, e.name));
        } else await unlink(path.join(d, e.name));
      }
    };
    await clear(dir);
    await cg.remove("k");
    expect(await cg.exists("k")).toBe(false);
    await cg.remove("k"); // already gone is fine
    await cg.removeParentIfEmpty();
    expect(await cg.exists("k")).toBe(false);
  });

  it("reads a group's memory for its /proc/meminfo view: memory.max, memory.current, memory.stat", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    const dir = path.join(base, "g", "mem");
    await mkdir(dir, { recursive: true });
    expect(cg.memory("mem")).toBeUndefined();
    await writeFile(path.join(dir, "memory.max"), "max\n");
    await writeFile(path.join(dir, "memory.current"), "300000000\n");
    await writeFile(path.join(dir, "memory.stat"), "anon 200000000\nfile 90000000\ninactive_file 40000000\nslab_reclaimable 1000\npgfault 7\n");
    expect(cg.memory("mem")).toEqual({ limitBytes: Infinity, usageBytes: 300_000_000, stat: { anon: 200_000_000, file: 90_000_000, inactive_file: 40_000_000, slab_reclaimable: 1000 } });
    await writeFile(path.join(dir, "memory.max"), "1073741824\n");
    expect(cg.memory("mem")?.limitBytes).toBe(2 ** 30);
  });

  it("reclaims a paused group's memory through memory.reclaim, asking for all of it", async () => {
    const cg = new CgroupV2({ base, group: "g" });
    const dir = path.join(base, "g", "sbx1");
    await mkdir(dir, { recursive: true });
    await writeFile(path.join(dir, "memory.current"), "52428800\n");
    expect(await cg.reclaim("sbx1")).toEqual({ beforeBytes: 52428800, afterBytes: 52428800, method: "memory.reclaim" });
    expect(await read(dir, "memory.reclaim")).toBe("52428800");
    expect(await cg.reclaim("gone")).toEqual({ beforeBytes: 0, afterBytes: 0, method: "none" });
  });
});
