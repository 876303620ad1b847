import { access, chown, mkdir, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import type { SandboxUsage } from "../../provider.ts";
import { readUsage } from "../../host/cgroup-usage.ts";
import { isErrno, parseKeyed, readNumber, readPids, readText, readTextSync, subdirs } from "../../host/files.ts";
import type { CgroupBackend, CgroupLimits, MemoryStatKey, MemoryUse, Reclaimed, UserLimits } from "./types.ts";
import { AGENT_LEAF, FREEZE_DEADLINE_MS, signalAll, sleep, until, USER_LEAF } from "./types.ts";

// cgroup v1: one hierarchy per controller (memory, pids, cpu required; cpuacct and freezer used
// when mounted). A sandbox gets `<hierarchy>/<our own cgroup>/<group>/<name>` in each of them.

export type V1Controller = "memory" | "pids" | "cpu" | "cpuacct" | "freezer";

export interface V1Options {
  /** Directory of the runner's own cgroup in each hierarchy (co-mounted controllers share one). */
  hierarchies: Partial<Record<V1Controller, string>> & Record<"memory" | "pids" | "cpu", string>;
  /** Parent group under which sandbox groups are made. */
  group: string;
}

export class CgroupV1 implements CgroupBackend {
  readonly version = "v1";
  readonly #h: V1Options["hierarchies"];
  readonly #group: string;

  constructor(options: V1Options) {
    this.#h = options.hierarchies;
    this.#group = options.group;
  }

  #dir(controller: V1Controller, name: string): string | undefined {
    const base = this.#h[controller];
    return base === undefined ? undefined : path.join(base, this.#group, name);
  }

  paths(name: string): string[] {
    const dirs = new Set<string>();
    for (const c of Object.keys(this.#h) as V1Controller[]) dirs.add(this.#dir(c, name)!);
    return [...dirs];
  }

  procsFiles(name: string): string[] {
    return this.paths(name).map((d) => path.join(d, AGENT_LEAF, "cgroup.procs"));
  }

  async exists(name: string): Promise<boolean> {
    try {
      await access(this.#dir("pids", name)!);
      return true;
    } catch {
      return false;
    }
  }

  userProcsFiles(name: string): string[] {
    return this.paths(name).map((d) => path.join(d, USER_LEAF, "cgroup.procs"));
  }

  async create(name: string, limits: CgroupLimits, user?: UserLimits, userOwner?: number): Promise<void> {
    for (const d of this.paths(name)) {
      await mkdir(d, { recursive: true });
      for (const leaf of [AGENT_LEAF, USER_LEAF]) await mkdir(path.join(d, leaf), { recursive: true });
    }
    const mem = this.#dir("memory", name)!;
    const pids = this.#dir("pids", name)!;
    await setMemoryLimit(mem, limits.memoryBytes);
    await writeFile(path.join(pids, "pids.max"), String(limits.pidsMax));
    const cpu = this.#dir("cpu", name)!;
    await writeFile(path.join(cpu, "cpu.cfs_period_us"), String(limits.cpuPeriodUs));
    await writeFile(path.join(cpu, "cpu.cfs_quota_us"), String(limits.cpuQuotaUs));
    // The user leaf: its own budget below the totals (the cpu quota is shared, the agent's leaf
    // having equal shares keeps it responsive under a busy loop).
    await setMemoryLimit(path.join(mem, USER_LEAF), user?.memoryBytes ?? limits.memoryBytes);
    await writeFile(path.join(pids, USER_LEAF, "pids.max"), String(user?.pidsMax ?? limits.pidsMax));
    // v1 lets a writer move a process when it may write the destination's procs file and owns
    // the process: the sandbox uid gets the user leaf's files, no other.
    if (userOwner !== undefined) for (const f of this.userProcsFiles(name)) await chown(f, userOwner, userOwner);
  }

  async pids(name: string): Promise<number[]> {
    // v1 lists a group's own tasks only: the leaves are read too.
    const dir = this.#dir("pids", name)!;
    const all = await Promise.all([dir, path.join(dir, AGENT_LEAF), path.join(dir, USER_LEAF)].map((d) => readPids(path.join(d, "cgroup.procs"))));
    return all.flat();
  }

  async agentPids(name: string): Promise<number[]> {
    return readPids(path.join(this.#dir("pids", name)!, AGENT_LEAF, "cgroup.procs"));
  }

  async stats(name: string): Promise<SandboxUsage | undefined> {
    if (!(await this.exists(name))) return undefined;
    const dirs = { version: "v1" as const, memory: this.#dir("memory", name)!, pids: this.#dir("pids", name)!, cpu: this.#dir("cpu", name)!, cpuacct: this.#dir("cpuacct", name) };
    return readUsage(dirs, { leaves: [AGENT_LEAF, USER_LEAF], userLeaf: USER_LEAF });
  }

  memory(name: string): MemoryUse | undefined {
    const mem = this.#dir("memory", name)!;
    // Two reads: the group's own memory.stat fields leave out its leaves, the total_* ones do not.
    const usage = readTextSync(path.join(mem, "memory.usage_in_bytes"));
    const statText = usage === undefined ? undefined : readTextSync(path.join(mem, "memory.stat"));
    if (usage === undefined || statText === undefined) return undefined;
    const raw = parseKeyed(statText);
    const stat: MemoryUse["stat"] = {};
    for (const [key, v1] of V1_STAT) {
      const v = raw.get(`total_${v1}`);
      if (v !== undefined) stat[key] = v;
    }
    // hierarchical_memory_limit is the smallest limit up the tree; "unlimited" is ~2^63.
    const limit = raw.get("hierarchical_memory_limit") ?? Infinity;
    return { limitBytes: limit >= 2 ** 62 ? Infinity : limit, usageBytes: Number(usage), stat };
  }

  async freeze(name: string): Promise<void> {
    const dir = this.#dir("freezer", name);
    if (dir === undefined) throw new Error("this host's cgroup v1 has no freezer hierarchy mounted");
    await writeFile(path.join(dir, "freezer.state"), "FROZEN");
    // v1 reports FREEZING until every task of the subtree is stopped.
    if (await until(async () => (await readText(path.join(dir, "freezer.state")))?.trim() === "FROZEN", FREEZE_DEADLINE_MS)) return;
    await this.thaw(name);
    throw new Error(`cgroup ${name} did not freeze within ${FREEZE_DEADLINE_MS} ms (a task stuck in uninterruptible sleep)`);
  }

  async thaw(name: string): Promise<void> {
    const dir = this.#dir("freezer", name);
    if (dir !== undefined && (await this.exists(name))) await writeFile(path.join(dir, "freezer.state"), "THAWED");
  }

  async frozen(name: string): Promise<boolean> {
    const dir = this.#dir("freezer", name);
    return dir !== undefined && (await readText(path.join(dir, "freezer.state")))?.trim() === "FROZEN";
  }

  async reclaim(name: string): Promise<Reclaimed> {
    const mem = this.#dir("memory", name)!;
    const usageFile = path.join(mem, "memory.usage_in_bytes");
    const limitFile = path.join(mem, "memory.limit_in_bytes");
    const [before, limit] = await Promise.all([readNumber(usageFile), readNumber(limitFile)]);
    if (before === undefined || limit === undefined) return { beforeBytes: 0, afterBytes: 0, method: "none" };
    // v1 has no memory.reclaim: a limit below the usage makes the kernel reclaim down to it, and
    // refuses (EBUSY) when it cannot (anonymous memory without swap). Aim at what page cache
    // leaves, then halfway back up until the kernel accepts; the limit is put back at once (the
    // group is frozen: nothing refills the cache until it thaws).
    const cache = this.memory(name)?.stat.file ?? 0;
    let target = Math.max(PAGE, before - cache);
    try {
      for (let step = 0; step < RECLAIM_STEPS && target < before; step++) {
        try {
          await writeFile(limitFile, String(roundUp(target)));
          break;
        } catch (err) {
          if (!isErrno(err, "EBUSY")) throw err;
          target += Math.ceil((before - target) / 2);
        }
      }
    } finally {
      await writeFile(limitFile, String(limit));
    }
    return { beforeBytes: before, afterBytes: (await readNumber(usageFile)) ?? 0, method: "limit" };
  }

  async kill(name: string): Promise<void> {
    if (!(await this.exists(name))) return;
    // Freeze first so nothing can fork while we kill (a fork bomb would otherwise race us).
    const freezer = this.#dir("freezer", name);
    const frozen = freezer !== undefined && (await this.#freeze(freezer));
    try {
      signalAll(await this.pids(name), "SIGKILL");
    } finally {
      // Also thaws a group that was paused: SIGKILL is only delivered to running tasks.
      if (frozen) await writeFile(path.join(freezer!, "freezer.state"), "THAWED");
    }
    for (let i = 0; i < 1000; i++) {
      const left = await this.pids(name);
      if (left.length === 0) return;
      signalAll(left, "SIGKILL");
      await sleep(i < 50 ? 2 : 10);
    }
    throw new Error(`processes of cgroup ${name} did not exit after SIGKILL`);
  }

  async #freeze(dir: string): Promise<boolean> {
    try {
      await writeFile(path.join(dir, "freezer.state"), "FROZEN");
      for (let i = 0; i < 200; i++) {
        if ((await readText(path.join(dir, "freezer.state")))?.trim() === "FROZEN") return true;
        await sleep(1);
      }
      return true; // partially frozen is still better; thaw happens in kill()
    } catch {
      return false;
    }
  }

  async remove(name: string): Promise<void> {
    // One hierarchy's leaves before its group; the hierarchies at once.
    const results = await Promise.allSettled(
      this.paths(name).map(async (d) => {
        await Promise.all([AGENT_LEAF, USER_LEAF].map((leaf) => rmdirRetry(path.join(d, leaf))));
        await rmdirRetry(d);
      }),
    );
    for (const r of results) if (r.status === "rejected") throw r.reason;
  }

  async names(): Promise<string[]> {
    const parents = new Set(Object.values(this.#h).map((b) => path.join(b!, this.#group)));
    return [...new Set((await Promise.all([...parents].map(subdirs))).flat())];
  }

  async removeParentIfEmpty(): Promise<void> {
    const parents = new Set(Object.values(this.#h).map((b) => path.join(b!, this.#group)));
    for (const p of parents) {
      try {
        await rmdir(p);
      } catch {
        // still has sandboxes, or already gone
      }
    }
  }
}

const PAGE = 4096;
/** Tries of a lowered limit, each halfway closer to the usage. */
const RECLAIM_STEPS = 4;
const roundUp = (bytes: number) => Math.ceil(bytes / PAGE) * PAGE;

/** v1's memory.stat names (as total_<name>) of the v2 names MemoryUse keeps. */
const V1_STAT: [MemoryStatKey, string][] = [
  ["file", "cache"], ["anon", "rss"], ["anon_thp", "rss_huge"], ["shmem", "shmem"], ["file_mapped", "mapped_file"], ["file_dirty", "dirty"], ["file_writeback", "writeback"],
  ["inactive_anon", "inactive_anon"], ["active_anon", "active_anon"], ["inactive_file", "inactive_file"], ["active_file", "active_file"], ["unevictable", "unevictable"],
];

/** memory.limit (and memsw, when swap is accounted) of a v1 memory group. */
async function setMemoryLimit(mem: string, bytes: number): Promise<void> {
  const memsw = path.join(mem, "memory.memsw.limit_in_bytes");
  const hasMemsw = (await readText(memsw)) !== undefined;
  const current = (await readNumber(path.join(mem, "memory.limit_in_bytes"))) ?? 0;
  // memory.limit <= memsw.limit must hold after every write: raise memsw first, lower it last.
  const writes: [string, number][] = [[path.join(mem, "memory.limit_in_bytes"), bytes]];
  if (hasMemsw) {
    if (bytes > current) writes.unshift([memsw, bytes]);
    else writes.push([memsw, bytes]);
  }
  for (const [file, value] of writes) await writeFile(file, String(value));
}

/** rmdir of a cgroup: EBUSY while the last exiting task is still being reaped. */
export async function rmdirRetry(dir: string): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      if (isErrno(err, "ENOENT")) return;
      if (!isErrno(err, "EBUSY") || i >= 200) throw err;
      await sleep(5);
    }
  }
}
