import { readFileSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";

// One interface over cgroup v1 and v2: the provider creates one group per sandbox, the launcher
// writes its own pid into `procsFiles` before exec'ing the sandbox, and OOM / pids / throttling
// are read back from the group's counters (never inferred from exit codes).
//
// A sandbox group holds the sandbox's total limits and two leaves: `agent` (the launcher, the
// init and the agent) and `user` (everything the agent starts for the user), whose own memory
// and pids limits stop short of the total by a reserve. User code can exhaust its leaf, never
// the agent's share; the counters are read from the sandbox group (totals over both leaves).

export interface CgroupLimits {
  memoryBytes: number;
  pidsMax: number;
  /** CPU time per period, in microseconds. */
  cpuQuotaUs: number;
  cpuPeriodUs: number;
}

/** The user leaf's own limits (below the sandbox's totals). */
export interface UserLimits {
  memoryBytes: number;
  pidsMax: number;
}

/** Names of a sandbox group's two leaves. */
export const AGENT_LEAF = "agent";
export const USER_LEAF = "user";

export interface CgroupStats {
  memoryBytes: number;
  memoryPeakBytes?: number;
  memoryLimitBytes: number;
  oomKills: number;
  pids: number;
  pidsLimit: number;
  pidsLimitHits: number;
  /** The user leaf is at its own pids limit now: user forks are refused (see SandboxUsage). */
  pidsSaturated?: boolean;
  cpuUsageUsec?: number;
  cpuPeriods: number;
  cpuThrottledPeriods: number;
  cpuThrottledUsec: number;
}

/**
 * A sandbox group's memory, over both leaves, in bytes: what its /proc/meminfo view is computed
 * from (meminfo.ts). `stat` holds memory.stat's figures under v2's names (v1's total_* mapped).
 */
export interface MemoryUse {
  /** The group's limit, ancestors' included where the kernel says (Infinity: none). */
  limitBytes: number;
  usageBytes: number;
  stat: Partial<Record<MemoryStatKey, number>>;
}

export const MEMORY_STAT_KEYS = ["file", "anon", "anon_thp", "shmem", "file_mapped", "file_dirty", "file_writeback", "inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable", "slab_reclaimable", "slab_unreclaimable", "kernel_stack", "pagetables"] as const;
export type MemoryStatKey = (typeof MEMORY_STAT_KEYS)[number];

export interface CgroupBackend {
  readonly version: "v1" | "v2";
  /**
   * Creates (or resets the limits of) the sandbox group `name` with its `agent` and `user`
   * leaves. The user leaf's procs file(s) are handed to `userOwner` (the sandbox's host uid), so
   * the agent can move the processes it starts there; nothing else of the tree is theirs.
   */
  create(name: string, limits: CgroupLimits, user?: UserLimits, userOwner?: number): Promise<void>;
  /** Files a process writes its pid into to join the agent leaf (one per v1 hierarchy). */
  procsFiles(name: string): string[];
  /** Files a process writes its pid into to join the user leaf (one per v1 hierarchy). */
  userProcsFiles(name: string): string[];
  exists(name: string): Promise<boolean>;
  /** Pids in the group and its leaves (empty when the group does not exist). */
  pids(name: string): Promise<number[]>;
  stats(name: string): Promise<CgroupStats | undefined>;
  /**
   * The group's memory limit, usage and memory.stat (undefined when the group does not exist).
   * Synchronous: the files are made by the kernel in microseconds, and the meminfo refresher reads
   * them for every sandbox every second, where async reads cost ten times the CPU (measured).
   */
  memory(name: string): MemoryUse | undefined;
  /** SIGKILLs every process in the group and waits until it is empty. */
  kill(name: string): Promise<void>;
  /** Removes the (empty) group; a missing group is fine. */
  remove(name: string): Promise<void>;
  /** Pids in the agent leaf. */
  agentPids(name: string): Promise<number[]>;
  /** Directories of the group, for leak checks. */
  paths(name: string): string[];
  /** Removes the provider's parent group when no sandbox group is left in it. */
  removeParentIfEmpty(): Promise<void>;
  /** Names of the sandbox groups under the provider's parent group (a crash's leftovers too). */
  names(): Promise<string[]>;
}

/** "key value" lines (memory.events, cpu.stat, pids.events, memory.oom_control) as numbers. */
export function parseKeyed(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    const [k, v] = line.trim().split(/\s+/);
    if (k && v !== undefined && /^-?\d+$/.test(v)) out.set(k, Number(v));
  }
  return out;
}

export async function readText(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    if (isErrno(err, "ENOENT")) return undefined;
    throw err;
  }
}

/** readText, blocking (see CgroupBackend.memory). */
export function readTextSync(file: string): string | undefined {
  try {
    return readFileSync(file, "utf8");
  } catch (err) {
    if (isErrno(err, "ENOENT")) return undefined;
    throw err;
  }
}

/** A number from a one-value file; "max" reads as Infinity. */
export async function readNumber(file: string): Promise<number | undefined> {
  const t = (await readText(file))?.trim();
  if (t === undefined || t === "") return undefined;
  if (t === "max") return Infinity;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
}

/**
 * A counter of a sandbox group over its leaves. Kernels count some events in the group where
 * they happened only (v1 OOM kills, older pids.events) and others up the tree too: the larger
 * of the group's own value and the sum of its leaves' is the total either way.
 */
export async function treeCounter(dir: string, file: string, key: string): Promise<number> {
  const read = async (d: string) => parseKeyed((await readText(path.join(d, file))) ?? "").get(key) ?? 0;
  const [own, agent, user] = await Promise.all([read(dir), read(path.join(dir, AGENT_LEAF)), read(path.join(dir, USER_LEAF))]);
  return Math.max(own, agent + user);
}

/** A pids group at its limit (a limit of "max" never is). */
export function saturated(current: number | undefined, max: number | undefined): boolean {
  return current !== undefined && max !== undefined && Number.isFinite(max) && current >= max;
}

export async function readPids(file: string): Promise<number[]> {
  const t = await readText(file);
  if (!t) return [];
  return t
    .split("\n")
    .filter((l) => /^\d+$/.test(l))
    .map(Number);
}

export function isErrno(err: unknown, code: string): boolean {
  return typeof err === "object" && err !== null && (err as { code?: unknown }).code === code;
}

export function signalAll(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch (err) {
      if (!isErrno(err, "ESRCH")) throw err;
    }
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Names of the directories in `dir` (none when it does not exist). */
export async function subdirs(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (err) {
    if (isErrno(err, "ENOENT")) return [];
    throw err;
  }
}
