import { readFile } from "node:fs/promises";

// One interface over cgroup v1 and v2: the provider creates one group per sandbox, the launcher
// writes its own pid into `procsFiles` before exec'ing the sandbox, and OOM / pids / throttling
// are read back from the group's counters (never inferred from exit codes).

export interface CgroupLimits {
  memoryBytes: number;
  pidsMax: number;
  /** CPU time per period, in microseconds. */
  cpuQuotaUs: number;
  cpuPeriodUs: number;
}

export interface CgroupStats {
  memoryBytes: number;
  memoryPeakBytes?: number;
  memoryLimitBytes: number;
  oomKills: number;
  pids: number;
  pidsLimit: number;
  pidsLimitHits: number;
  cpuUsageUsec?: number;
  cpuPeriods: number;
  cpuThrottledPeriods: number;
  cpuThrottledUsec: number;
}

export interface CgroupBackend {
  readonly version: "v1" | "v2";
  /** Creates (or resets the limits of) the group `name`. */
  create(name: string, limits: CgroupLimits): Promise<void>;
  /** Files a process writes its pid into to join the group (one per v1 hierarchy). */
  procsFiles(name: string): string[];
  exists(name: string): Promise<boolean>;
  /** Pids in the group (empty when the group does not exist). */
  pids(name: string): Promise<number[]>;
  stats(name: string): Promise<CgroupStats | undefined>;
  /** SIGKILLs every process in the group and waits until it is empty. */
  kill(name: string): Promise<void>;
  /** Removes the (empty) group; a missing group is fine. */
  remove(name: string): Promise<void>;
  /** Directories of the group, for leak checks. */
  paths(name: string): string[];
  /** Removes the provider's parent group when no sandbox group is left in it. */
  removeParentIfEmpty(): Promise<void>;
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

/** A number from a one-value file; "max" reads as Infinity. */
export async function readNumber(file: string): Promise<number | undefined> {
  const t = (await readText(file))?.trim();
  if (t === undefined || t === "") return undefined;
  if (t === "max") return Infinity;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
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
