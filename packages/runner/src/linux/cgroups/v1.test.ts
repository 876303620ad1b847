import { spawn } from "node:child_process";
import { access, readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups } from "./detect.ts";
import type { CgroupBackend } from "./types.ts";

// The v1 back end on this host's real hierarchies (the machine kind has memory, pids, cpu,
// cpuacct and freezer on v1).

let cg: CgroupBackend;
const group = `sandbar-v1test-${process.pid}`;
const name = "probe";

beforeAll(async () => {
  cg = await detectCgroups({ group });
});

afterAll(async () => {
  await cg.kill(name);
  await cg.remove(name);
  await cg.removeParentIfEmpty();
});

describe("cgroup v1 back end (this host)", () => {
  it("is the back end detected here, below the runner's own cgroup", async () => {
    expect(cg.version).toBe("v1");
    const own = await readFile("/proc/self/cgroup", "utf8");
    const memPath = /^\d+:memory:(.*)$/m.exec(own)![1];
    expect(cg.paths(name).some((p) => p.startsWith(`/sys/fs/cgroup/memory${memPath === "/" ? "" : memPath}/${group}/`))).toBe(true);
  });

  it("splits the group: the sandbox uid moves its own processes into the user leaf, never into the agent's", async () => {
    const uid = 1_599_000_000 + (process.pid % 1000);
    await cg.create(name, { memoryBytes: 256 * 2 ** 20, pidsMax: 100, cpuQuotaUs: 50_000, cpuPeriodUs: 100_000 }, { memoryBytes: 192 * 2 ** 20, pidsMax: 36 }, uid);
    const mem = cg.paths(name).find((p) => p.includes("/memory/"))!;
    const pids = cg.paths(name).find((p) => p.includes("/pids/"))!;
    expect((await readFile(`${mem}/user/memory.limit_in_bytes`, "utf8")).trim()).toBe(String(192 * 2 ** 20));
    expect((await readFile(`${pids}/user/pids.max`, "utf8")).trim()).toBe("36");
    expect((await readFile(`${pids}/pids.max`, "utf8")).trim()).toBe("100");
    // Joined to the agent leaf as root (the launcher), then as the sandbox uid (the agent's wrapper).
    const join = 'for f in $AGENT; do echo $$ > "$f"; done; exec setpriv --reuid=$ID --regid=$ID --clear-groups sh -c \'for f in $USERF; do echo 0 > "$f" || exit 9; done; for f in $AGENT; do echo 0 > "$f" 2>/dev/null && exit 8; done; exec sleep 60\'';
    const child = spawn("/bin/sh", ["-c", join], { stdio: "ignore", env: { PATH: process.env.PATH, ID: String(uid), AGENT: cg.procsFiles(name).join(" "), USERF: cg.userProcsFiles(name).join(" ") } });
    const exited = new Promise<number | null>((r) => child.once("exit", r));
    let inUser: number[] = [];
    for (let i = 0; i < 200 && !inUser.includes(child.pid!); i++) {
      await new Promise((r) => setTimeout(r, 10));
      inUser = (await readFile(`${pids}/user/cgroup.procs`, "utf8")).split("\n").filter(Boolean).map(Number);
    }
    expect(inUser).toContain(child.pid);
    expect(await cg.agentPids(name)).toEqual([]);
    expect(await cg.pids(name)).toEqual([child.pid]);
    await cg.kill(name);
    expect(await exited).toBe(null); // killed, not exit 8 (moved back) or 9 (could not join)
    await cg.remove(name);
  });

  it("creates a group with its limits, lets a process join, kills it and removes the group", async () => {
    await cg.create(name, { memoryBytes: 64 * 2 ** 20, pidsMax: 20, cpuQuotaUs: 25_000, cpuPeriodUs: 100_000 });
    const mem = cg.paths(name).find((p) => p.includes("/memory/"))!;
    expect((await readFile(`${mem}/memory.limit_in_bytes`, "utf8")).trim()).toBe(String(64 * 2 ** 20));
    const cpu = cg.paths(name).find((p) => p.includes("/cpu/"))!;
    expect((await readFile(`${cpu}/cpu.cfs_quota_us`, "utf8")).trim()).toBe("25000");
    const pids = cg.paths(name).find((p) => p.includes("/pids/"))!;
    expect((await readFile(`${pids}/pids.max`, "utf8")).trim()).toBe("20");

    // Join the way the launcher does, then fork a few children that must be counted too.
    const files = cg.procsFiles(name);
    const child = spawn("/bin/sh", ["-c", 'for f in "$@"; do echo $$ > "$f"; done; sleep 60 & sleep 60 & wait', "sh", ...files], { stdio: "ignore" });
    let joined: number[] = [];
    for (let i = 0; i < 200 && joined.length < 3; i++) {
      await new Promise((r) => setTimeout(r, 10));
      joined = await cg.pids(name);
    }
    expect(joined).toContain(child.pid);
    expect(joined.length).toBe(3);
    const stats = await cg.stats(name);
    expect(stats?.pids).toBe(3);
    expect(stats?.pidsLimit).toBe(20);
    expect(stats?.memoryLimitBytes).toBe(64 * 2 ** 20);

    const exited = new Promise((r) => child.once("exit", r));
    await cg.kill(name);
    await exited;
    expect(await cg.pids(name)).toEqual([]);
    await cg.remove(name);
    for (const p of cg.paths(name)) await expect(access(p)).rejects.toThrow();
  });

  it("freezes a group with a busy process in its user leaf, reports it frozen, and thaws it back to running", async () => {
    await cg.create(name, { memoryBytes: 64 * 2 ** 20, pidsMax: 20, cpuQuotaUs: 50_000, cpuPeriodUs: 100_000 });
    const child = spawn("/bin/sh", ["-c", 'for f in "$@"; do echo $$ > "$f"; done; while :; do :; done', "sh", ...cg.userProcsFiles(name)], { stdio: "ignore" });
    for (let i = 0; i < 200 && !(await cg.pids(name)).includes(child.pid!); i++) await new Promise((r) => setTimeout(r, 10));
    expect(await cg.frozen(name)).toBe(false);
    await cg.freeze(name);
    expect(await cg.frozen(name)).toBe(true);
    const cpuacct = cg.paths(name).find((p) => p.includes("/cpuacct"))!;
    const used = async () => Number((await readFile(`${cpuacct}/cpuacct.usage`, "utf8")).trim());
    // Frozen: two reads of its CPU time agree (a running loop adds to it between any two reads).
    const a = await used();
    await new Promise((r) => setImmediate(r));
    expect(await used()).toBe(a);
    await cg.freeze(name); // idempotent
    await cg.thaw(name);
    expect(await cg.frozen(name)).toBe(false);
    let after = a;
    for (let i = 0; i < 500 && after === a; i++) {
      await new Promise((r) => setTimeout(r, 2));
      after = await used();
    }
    expect(after).toBeGreaterThan(a);
    // A frozen group is still killed and removed (kill thaws it).
    await cg.freeze(name);
    const exited = new Promise((r) => child.once("exit", r));
    await cg.kill(name);
    await exited;
    await cg.remove(name);
    expect(await cg.frozen(name)).toBe(false);
  });
});
