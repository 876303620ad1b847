import { access, chown, mkdir, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import type { SandboxUsage } from "../../provider.ts";
import { readUsage } from "../../host/cgroup-usage.ts";
import { isErrno, parseKeyed, readNumber, readPids, readText, readTextSync, subdirs } from "../../host/files.ts";
import type { CgroupBackend, CgroupLimits, MemoryUse, Reclaimed, UserLimits } from "./types.ts";
import { AGENT_LEAF, FREEZE_DEADLINE_MS, MEMORY_STAT_KEYS, signalAll, sleep, until, USER_LEAF } from "./types.ts";
import { rmdirRetry } from "./v1.ts";

// cgroup v2 (unified): one tree; `<our own cgroup>/<group>/<name>` per sandbox, with memory, pids
// and cpu enabled down the path. This machine kind only has hugetlb on its cgroup2 mount, so this
// back end is exercised against a fake cgroupfs directory in tests.

const CONTROLLERS = ["memory", "pids", "cpu"] as const;

export interface V2Options {
  /** Directory of the runner's own cgroup (e.g. /sys/fs/cgroup/system.slice/sandbar.service). */
  base: string;
  group: string;
}

export class CgroupV2 implements CgroupBackend {
  readonly version = "v2";
  readonly #base: string;
  readonly #group: string;

  constructor(options: V2Options) {
    this.#base = options.base;
    this.#group = options.group;
  }

  #dir(name: string): string {
    return path.join(this.#base, this.#group, name);
  }

  /**
   * Enables memory, pids and cpu for sandbox groups. v2 forbids enabling controllers for children
   * of a group that holds processes, so when our own group is busy the runner moves itself into a
   * leaf (`<own>/runner`) first: the usual arrangement for a service that manages cgroups.
   */
  async prepare(): Promise<void> {
    const missing = async (dir: string) => {
      const enabled = ((await readText(path.join(dir, "cgroup.subtree_control"))) ?? "").split(/\s+/);
      return CONTROLLERS.filter((c) => !enabled.includes(c));
    };
    const enable = (dir: string, cs: readonly string[]) =>
      writeFile(path.join(dir, "cgroup.subtree_control"), cs.map((c) => `+${c}`).join(" "));
    const available = ((await readText(path.join(this.#base, "cgroup.controllers"))) ?? "").split(/\s+/);
    const absent = CONTROLLERS.filter((c) => !available.includes(c));
    if (absent.length > 0) {
      throw new Error(`cgroup v2 at ${this.#base} lacks the ${absent.join(", ")} controller(s)`);
    }
    const own = await missing(this.#base);
    if (own.length > 0) {
      try {
        await enable(this.#base, own);
      } catch (err) {
        if (!isErrno(err, "EBUSY")) throw err;
        const leaf = path.join(this.#base, "runner");
        await mkdir(leaf, { recursive: true });
        await writeFile(path.join(leaf, "cgroup.procs"), String(process.pid));
        await enable(this.#base, own);
      }
    }
    const parent = path.join(this.#base, this.#group);
    await mkdir(parent, { recursive: true });
    const sub = await missing(parent);
    if (sub.length > 0) await enable(parent, sub);
  }

  paths(name: string): string[] {
    return [this.#dir(name)];
  }

  procsFiles(name: string): string[] {
    return [path.join(this.#dir(name), AGENT_LEAF, "cgroup.procs")];
  }

  userProcsFiles(name: string): string[] {
    return [path.join(this.#dir(name), USER_LEAF, "cgroup.procs")];
  }

  async exists(name: string): Promise<boolean> {
    try {
      await access(this.#dir(name));
      return true;
    } catch {
      return false;
    }
  }

  async create(name: string, limits: CgroupLimits, user?: UserLimits, userOwner?: number): Promise<void> {
    const d = this.#dir(name);
    await mkdir(d, { recursive: true });
    await writeLimits(d, limits.memoryBytes, limits.pidsMax);
    await writeFile(path.join(d, "cpu.max"), `${limits.cpuQuotaUs} ${limits.cpuPeriodUs}`);
    // Processes live in the leaves only (v2's no-internal-process rule).
    await writeFile(path.join(d, "cgroup.subtree_control"), CONTROLLERS.map((c) => `+${c}`).join(" "));
    for (const leaf of [AGENT_LEAF, USER_LEAF]) await mkdir(path.join(d, leaf), { recursive: true });
    await writeLimits(path.join(d, USER_LEAF), user?.memoryBytes ?? limits.memoryBytes, user?.pidsMax ?? limits.pidsMax);
    if (userOwner !== undefined) {
      // v2 checks the destination's procs file and the one of the common ancestor of source and
      // destination (the sandbox group): both go to the sandbox uid. The ancestor is no way out:
      // it holds children with controllers, so the kernel refuses processes there (EBUSY).
      for (const f of [path.join(d, USER_LEAF, "cgroup.procs"), path.join(d, "cgroup.procs")]) await chown(f, userOwner, userOwner);
    }
  }

  async pids(name: string): Promise<number[]> {
    const d = this.#dir(name);
    const all = await Promise.all([d, path.join(d, AGENT_LEAF), path.join(d, USER_LEAF)].map((x) => readPids(path.join(x, "cgroup.procs"))));
    return all.flat();
  }

  async agentPids(name: string): Promise<number[]> {
    return readPids(path.join(this.#dir(name), AGENT_LEAF, "cgroup.procs"));
  }

  async stats(name: string): Promise<SandboxUsage | undefined> {
    if (!(await this.exists(name))) return undefined;
    return readUsage({ version: "v2", dir: this.#dir(name) }, { leaves: [AGENT_LEAF, USER_LEAF], userLeaf: USER_LEAF });
  }

  memory(name: string): MemoryUse | undefined {
    const d = this.#dir(name);
    // v2's memory.stat is hierarchical already; memory.max is the group's own (ancestors' not looked up).
    const usage = readTextSync(path.join(d, "memory.current"));
    const max = usage === undefined ? undefined : readTextSync(path.join(d, "memory.max"))?.trim();
    const statText = max === undefined ? undefined : readTextSync(path.join(d, "memory.stat"));
    if (usage === undefined || max === undefined || statText === undefined) return undefined;
    const raw = parseKeyed(statText);
    const stat: MemoryUse["stat"] = {};
    for (const key of MEMORY_STAT_KEYS) {
      const v = raw.get(key);
      if (v !== undefined) stat[key] = v;
    }
    return { limitBytes: max === "max" ? Infinity : Number(max), usageBytes: Number(usage), stat };
  }

  async freeze(name: string): Promise<void> {
    const d = this.#dir(name);
    if ((await readText(path.join(d, "cgroup.freeze"))) === undefined) throw new Error(`cgroup ${name} has no cgroup.freeze (Linux 5.2+ is needed to pause)`);
    await writeFile(path.join(d, "cgroup.freeze"), "1");
    // cgroup.events says "frozen 1" once every task of the subtree is stopped.
    if (await until(async () => this.frozen(name), FREEZE_DEADLINE_MS)) return;
    await this.thaw(name);
    throw new Error(`cgroup ${name} did not freeze within ${FREEZE_DEADLINE_MS} ms (a task stuck in uninterruptible sleep)`);
  }

  async thaw(name: string): Promise<void> {
    const d = this.#dir(name);
    if ((await readText(path.join(d, "cgroup.freeze"))) !== undefined) await writeFile(path.join(d, "cgroup.freeze"), "0");
  }

  async frozen(name: string): Promise<boolean> {
    const events = await readText(path.join(this.#dir(name), "cgroup.events"));
    return events !== undefined && parseKeyed(events).get("frozen") === 1;
  }

  async reclaim(name: string): Promise<Reclaimed> {
    const file = path.join(this.#dir(name), "memory.current");
    const before = await readNumber(file);
    if (before === undefined) return { beforeBytes: 0, afterBytes: 0, method: "none" };
    // Asking for everything: the kernel takes what it can and answers EAGAIN for the rest
    // (anonymous memory without swap); what it took is reclaimed either way.
    await writeFile(path.join(this.#dir(name), "memory.reclaim"), String(before)).catch((err: unknown) => {
      if (!isErrno(err, "EAGAIN")) throw err;
    });
    return { beforeBytes: before, afterBytes: (await readNumber(file)) ?? 0, method: "memory.reclaim" };
  }

  async kill(name: string): Promise<void> {
    if (!(await this.exists(name))) return;
    const d = this.#dir(name);
    // cgroup.kill (Linux 5.14+) kills the whole subtree atomically; otherwise freeze and kill.
    let viaKillFile = false;
    if ((await readText(path.join(d, "cgroup.kill"))) !== undefined) {
      try {
        await writeFile(path.join(d, "cgroup.kill"), "1");
        viaKillFile = true;
      } catch {
        // fall through to the signal loop
      }
    }
    if (!viaKillFile) {
      const canFreeze = (await readText(path.join(d, "cgroup.freeze"))) !== undefined;
      if (canFreeze) await writeFile(path.join(d, "cgroup.freeze"), "1").catch(() => undefined);
      signalAll(await this.pids(name), "SIGKILL");
      if (canFreeze) await writeFile(path.join(d, "cgroup.freeze"), "0").catch(() => undefined);
    }
    for (let i = 0; i < 1000; i++) {
      const left = await this.pids(name);
      if (left.length === 0) return;
      signalAll(left, "SIGKILL");
      await sleep(i < 50 ? 2 : 10);
    }
    throw new Error(`processes of cgroup ${name} did not exit after SIGKILL`);
  }

  async remove(name: string): Promise<void> {
    for (const leaf of [AGENT_LEAF, USER_LEAF]) await rmdirRetry(path.join(this.#dir(name), leaf));
    await rmdirRetry(this.#dir(name));
  }

  names(): Promise<string[]> {
    return subdirs(path.join(this.#base, this.#group));
  }

  async removeParentIfEmpty(): Promise<void> {
    try {
      await rmdir(path.join(this.#base, this.#group));
    } catch {
      // still has sandboxes, or already gone
    }
  }
}

/** memory.max (no swap on top) and pids.max of a v2 group. */
async function writeLimits(dir: string, memoryBytes: number, pidsMax: number): Promise<void> {
  await writeFile(path.join(dir, "memory.max"), String(memoryBytes));
  // The file is absent when the kernel has no swap support.
  if ((await readText(path.join(dir, "memory.swap.max"))) !== undefined) await writeFile(path.join(dir, "memory.swap.max"), "0");
  await writeFile(path.join(dir, "pids.max"), String(pidsMax));
}
