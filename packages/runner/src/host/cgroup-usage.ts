import path from "node:path";
import type { SandboxUsage } from "../provider.ts";
import { parseKeyed, readNumber, readText } from "./files.ts";

// A sandbox's usage from its cgroup counters (v1 or v2), for every provider: the linux provider
// reads the group it made, the Docker provider the container's group (found through its first
// process, cheaper than the engine's stats call, and with the OOM kills and refused forks the
// engine does not report).

const CGROUP_ROOT = "/sys/fs/cgroup";

/** Where a group's counters are: v2's one directory, or v1's directory per controller. */
export type CgroupDirs = { version: "v2"; dir: string } | { version: "v1"; memory: string; pids?: string; cpu?: string; cpuacct?: string };

export interface UsageOptions {
  /** Sub-groups the group's processes live in (the linux provider's agent and user leaves): counters are totals over them. */
  leaves?: readonly string[];
  /** The sub-group whose pids limit is the user's (the user leaf); the group's own when absent. */
  userLeaf?: string;
}

/**
 * A counter of a group over its leaves. Kernels count some events in the group where they
 * happened only (v1 OOM kills, older pids.events) and others up the tree too: the larger of the
 * group's own value and the sum of its leaves' is the total either way.
 */
async function treeCounter(dir: string, leaves: readonly string[], file: string, key: string): Promise<number> {
  const read = async (d: string) => parseKeyed((await readText(path.join(d, file))) ?? "").get(key) ?? 0;
  const [own, ...inLeaves] = await Promise.all([read(dir), ...leaves.map((l) => read(path.join(dir, l)))]);
  return Math.max(own!, inLeaves.reduce((a, b) => a + b, 0));
}

/** A pids group at its limit (a limit of "max" never is). */
function saturated(current: number | undefined, max: number | undefined): boolean {
  return current !== undefined && max !== undefined && Number.isFinite(max) && current >= max;
}

/** The group's usage since it was made; independent reads, at once (a start answers with them). */
export async function readUsage(dirs: CgroupDirs, o: UsageOptions = {}): Promise<SandboxUsage> {
  const leaves = o.leaves ?? [];
  const v2 = dirs.version === "v2";
  const mem = v2 ? dirs.dir : dirs.memory;
  const pids = v2 ? dirs.dir : dirs.pids;
  const cpu = v2 ? dirs.dir : dirs.cpu;
  const userPids = pids && (o.userLeaf ? path.join(pids, o.userLeaf) : pids);
  const num = (dir: string | undefined, file: string) => (dir ? readNumber(path.join(dir, file)) : Promise.resolve(undefined));
  const [oomKills, pidsLimitHits, cpuText, usageNs, memoryBytes, memoryPeakBytes, memoryLimitBytes, pidsNow, pidsLimit, userNow, userMax] = await Promise.all([
    treeCounter(mem, leaves, v2 ? "memory.events" : "memory.oom_control", "oom_kill"),
    pids ? treeCounter(pids, leaves, "pids.events", "max") : 0,
    cpu ? readText(path.join(cpu, "cpu.stat")) : undefined,
    v2 ? undefined : num(dirs.cpuacct, "cpuacct.usage"),
    num(mem, v2 ? "memory.current" : "memory.usage_in_bytes"),
    num(mem, v2 ? "memory.peak" : "memory.max_usage_in_bytes"),
    num(mem, v2 ? "memory.max" : "memory.limit_in_bytes"),
    num(pids, "pids.current"),
    num(pids, "pids.max"),
    num(userPids, "pids.current"),
    num(userPids, "pids.max"),
  ]);
  const cpuStat = parseKeyed(cpuText ?? "");
  return {
    memoryBytes: memoryBytes ?? 0,
    memoryPeakBytes,
    memoryLimitBytes: memoryLimitBytes ?? Infinity,
    oomKills,
    pids: pidsNow ?? 0,
    pidsLimit: pidsLimit ?? Infinity,
    pidsLimitHits,
    pidsSaturated: saturated(userNow, userMax),
    // v2 counts in microseconds; v1's cpuacct.usage and throttled_time are nanoseconds.
    cpuUsageUsec: v2 ? cpuStat.get("usage_usec") : usageNs === undefined ? undefined : Math.round(usageNs / 1000),
    cpuPeriods: cpuStat.get("nr_periods") ?? 0,
    cpuThrottledPeriods: cpuStat.get("nr_throttled") ?? 0,
    cpuThrottledUsec: v2 ? (cpuStat.get("throttled_usec") ?? 0) : Math.round((cpuStat.get("throttled_time") ?? 0) / 1000),
  };
}

/** The cgroups `pid` is in, from /proc/<pid>/cgroup; undefined when the process is gone. */
async function cgroupDirsOfPid(pid: number): Promise<CgroupDirs | undefined> {
  const lines = await readText(`/proc/${pid}/cgroup`).catch(() => undefined);
  if (lines === undefined) return undefined;
  const v1 = new Map<string, string>();
  let v2: string | undefined;
  for (const line of lines.split("\n")) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line);
    if (!m) continue;
    if (m[1] === "0" && m[2] === "") v2 = m[3];
    for (const c of m[2]!.split(",")) if (c) v1.set(c, path.join(CGROUP_ROOT, m[2]!, m[3]!));
  }
  const memory = v1.get("memory");
  if (memory) return { version: "v1", memory, pids: v1.get("pids"), cpu: v1.get("cpu"), cpuacct: v1.get("cpuacct") };
  return v2 === undefined ? undefined : { version: "v2", dir: path.join(CGROUP_ROOT, v2) };
}

/** Usage of the cgroups `pid` is in; undefined when the process is gone. */
export async function usageOfPid(pid: number): Promise<SandboxUsage | undefined> {
  const dirs = await cgroupDirsOfPid(pid);
  return dirs && readUsage(dirs);
}
