import type { SandboxUsage } from "../../provider.ts";
import { isErrno } from "../../host/files.ts";

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

/** What a reclaim did: the group's memory before and after, and how it was asked for. */
export interface Reclaimed {
  beforeBytes: number;
  afterBytes: number;
  /** "memory.reclaim" (v2), "limit" (v1: a lowered limit), "none" (no group). */
  method: "memory.reclaim" | "limit" | "none";
}

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
  /** The group's counters, totals over both leaves (host/cgroup-usage.ts). */
  stats(name: string): Promise<SandboxUsage | undefined>;
  /**
   * The group's memory limit, usage and memory.stat (undefined when the group does not exist).
   * Synchronous: the files are made by the kernel in microseconds, and the meminfo refresher reads
   * them for every sandbox every second, where async reads cost ten times the CPU (measured).
   */
  memory(name: string): MemoryUse | undefined;
  /**
   * Freezes every process of the group (both leaves) and resolves once the kernel says the whole
   * group is frozen: nothing in it runs or writes until thaw(). Throws when this host's cgroups
   * have no freezer, or when the group does not settle within the deadline (it is thawed again).
   */
  freeze(name: string): Promise<void>;
  /** Lets a frozen group run again; a group that is not frozen is left as it is. */
  thaw(name: string): Promise<void>;
  /** Whether the group is frozen (false when it does not exist). */
  frozen(name: string): Promise<boolean>;
  /**
   * Gives the group's memory back to the host as far as the kernel lets it (pause: the group is
   * frozen). v2 writes memory.reclaim; v1 lowers memory.limit_in_bytes towards what cannot be
   * dropped and puts the limit back. Without swap only page cache goes; anonymous memory stays.
   */
  reclaim(name: string): Promise<Reclaimed>;
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

/** How long a freeze may take to settle: tasks in uninterruptible sleep (I/O) delay it. */
export const FREEZE_DEADLINE_MS = 10_000;

/** Polls `settled` (1 ms apart, then 10 ms) until it holds or the deadline passes. */
export async function until(settled: () => Promise<boolean>, deadlineMs: number): Promise<boolean> {
  const end = Date.now() + deadlineMs;
  for (let i = 0; ; i++) {
    if (await settled()) return true;
    if (Date.now() > end) return false;
    await sleep(i < 50 ? 1 : 10);
  }
}

