import { access, mkdir, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import type { CgroupBackend, CgroupLimits, CgroupStats } from "./types.ts";
import { isErrno, parseKeyed, readNumber, readPids, readText, signalAll, sleep } from "./types.ts";

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
    return this.paths(name).map((d) => path.join(d, "cgroup.procs"));
  }

  async exists(name: string): Promise<boolean> {
    try {
      await access(this.#dir("pids", name)!);
      return true;
    } catch {
      return false;
    }
  }

  async create(name: string, limits: CgroupLimits): Promise<void> {
    for (const d of this.paths(name)) await mkdir(d, { recursive: true });
    const mem = this.#dir("memory", name)!;
    const memsw = path.join(mem, "memory.memsw.limit_in_bytes");
    const hasMemsw = (await readText(memsw)) !== undefined;
    const current = (await readNumber(path.join(mem, "memory.limit_in_bytes"))) ?? 0;
    // memory.limit <= memsw.limit must hold after every write: raise memsw first, lower it last.
    const writes: [string, number][] = [[path.join(mem, "memory.limit_in_bytes"), limits.memoryBytes]];
    if (hasMemsw) {
      if (limits.memoryBytes > current) writes.unshift([memsw, limits.memoryBytes]);
      else writes.push([memsw, limits.memoryBytes]);
    }
    for (const [file, value] of writes) await writeFile(file, String(value));
    await writeFile(path.join(this.#dir("pids", name)!, "pids.max"), String(limits.pidsMax));
    const cpu = this.#dir("cpu", name)!;
    await writeFile(path.join(cpu, "cpu.cfs_period_us"), String(limits.cpuPeriodUs));
    await writeFile(path.join(cpu, "cpu.cfs_quota_us"), String(limits.cpuQuotaUs));
  }

  async pids(name: string): Promise<number[]> {
    return readPids(path.join(this.#dir("pids", name)!, "cgroup.procs"));
  }

  async stats(name: string): Promise<CgroupStats | undefined> {
    if (!(await this.exists(name))) return undefined;
    const mem = this.#dir("memory", name)!;
    const pids = this.#dir("pids", name)!;
    const cpu = this.#dir("cpu", name)!;
    const acct = this.#dir("cpuacct", name);
    const oom = parseKeyed((await readText(path.join(mem, "memory.oom_control"))) ?? "");
    const pidsEvents = parseKeyed((await readText(path.join(pids, "pids.events"))) ?? "");
    const cpuStat = parseKeyed((await readText(path.join(cpu, "cpu.stat"))) ?? "");
    const usageNs = acct ? await readNumber(path.join(acct, "cpuacct.usage")) : undefined;
    return {
      memoryBytes: (await readNumber(path.join(mem, "memory.usage_in_bytes"))) ?? 0,
      memoryPeakBytes: await readNumber(path.join(mem, "memory.max_usage_in_bytes")),
      memoryLimitBytes: (await readNumber(path.join(mem, "memory.limit_in_bytes"))) ?? Infinity,
      oomKills: oom.get("oom_kill") ?? 0,
      pids: (await readNumber(path.join(pids, "pids.current"))) ?? 0,
      pidsLimit: (await readNumber(path.join(pids, "pids.max"))) ?? Infinity,
      pidsLimitHits: pidsEvents.get("max") ?? 0,
      cpuUsageUsec: usageNs === undefined ? undefined : Math.round(usageNs / 1000),
      cpuPeriods: cpuStat.get("nr_periods") ?? 0,
      cpuThrottledPeriods: cpuStat.get("nr_throttled") ?? 0,
      cpuThrottledUsec: Math.round((cpuStat.get("throttled_time") ?? 0) / 1000),
    };
  }

  async kill(name: string): Promise<void> {
    if (!(await this.exists(name))) return;
    // Freeze first so nothing can fork while we kill (a fork bomb would otherwise race us).
    const freezer = this.#dir("freezer", name);
    const frozen = freezer !== undefined && (await this.#freeze(freezer));
    try {
      signalAll(await this.pids(name), "SIGKILL");
    } finally {
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
    for (const d of this.paths(name)) await rmdirRetry(d);
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
