import { readFile } from "node:fs/promises";
import path from "node:path";
import type { SandboxUsage } from "../provider.ts";
import { saturated } from "../linux/cgroups/types.ts";

// A container's usage, read from its cgroups (v1 or v2) as the linux provider reads its own, found
// through its first process's /proc/<pid>/cgroup: cheaper than the engine's stats call, and it has
// the OOM kills and refused forks the engine does not report.

const CGROUP_ROOT = "/sys/fs/cgroup";

async function text(file: string): Promise<string | undefined> {
  return readFile(file, "utf8").catch(() => undefined);
}

async function num(file: string): Promise<number | undefined> {
  const t = (await text(file))?.trim();
  if (t === undefined) return undefined;
  if (t === "max") return Infinity;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
}

async function keyed(file: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of ((await text(file)) ?? "").split("\n")) {
    const [k, v] = line.trim().split(/\s+/);
    if (k && v !== undefined && Number.isFinite(Number(v))) out.set(k, Number(v));
  }
  return out;
}

/** Usage of the cgroups `pid` is in; undefined when the process is gone. */
export async function usageOfPid(pid: number): Promise<SandboxUsage | undefined> {
  const lines = await text(`/proc/${pid}/cgroup`);
  if (lines === undefined) return undefined;
  const v1 = new Map<string, string>();
  let v2: string | undefined;
  for (const line of lines.split("\n")) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line);
    if (!m) continue;
    if (m[1] === "0" && m[2] === "") v2 = m[3];
    for (const c of m[2]!.split(",")) if (c) v1.set(c, path.join(CGROUP_ROOT, m[2]!, m[3]!));
  }
  if (v1.has("memory")) {
    const mem = v1.get("memory")!;
    const pids = v1.get("pids");
    const cpu = v1.get("cpu");
    const acct = v1.get("cpuacct");
    const cpuStat = cpu ? await keyed(path.join(cpu, "cpu.stat")) : new Map<string, number>();
    const usageNs = acct ? await num(path.join(acct, "cpuacct.usage")) : undefined;
    return {
      memoryBytes: (await num(path.join(mem, "memory.usage_in_bytes"))) ?? 0,
      memoryPeakBytes: await num(path.join(mem, "memory.max_usage_in_bytes")),
      memoryLimitBytes: (await num(path.join(mem, "memory.limit_in_bytes"))) ?? Infinity,
      oomKills: (await keyed(path.join(mem, "memory.oom_control"))).get("oom_kill") ?? 0,
      pids: pids ? ((await num(path.join(pids, "pids.current"))) ?? 0) : 0,
      pidsLimit: pids ? ((await num(path.join(pids, "pids.max"))) ?? Infinity) : Infinity,
      pidsLimitHits: pids ? ((await keyed(path.join(pids, "pids.events"))).get("max") ?? 0) : 0,
      pidsSaturated: pids ? saturated(await num(path.join(pids, "pids.current")), await num(path.join(pids, "pids.max"))) : false,
      cpuUsageUsec: usageNs === undefined ? undefined : Math.round(usageNs / 1000),
      cpuPeriods: cpuStat.get("nr_periods") ?? 0,
      cpuThrottledPeriods: cpuStat.get("nr_throttled") ?? 0,
      cpuThrottledUsec: Math.round((cpuStat.get("throttled_time") ?? 0) / 1000),
    };
  }
  if (v2 === undefined) return undefined;
  const dir = path.join(CGROUP_ROOT, v2);
  const cpuStat = await keyed(path.join(dir, "cpu.stat"));
  return {
    memoryBytes: (await num(path.join(dir, "memory.current"))) ?? 0,
    memoryPeakBytes: await num(path.join(dir, "memory.peak")),
    memoryLimitBytes: (await num(path.join(dir, "memory.max"))) ?? Infinity,
    oomKills: (await keyed(path.join(dir, "memory.events"))).get("oom_kill") ?? 0,
    pids: (await num(path.join(dir, "pids.current"))) ?? 0,
    pidsLimit: (await num(path.join(dir, "pids.max"))) ?? Infinity,
    pidsLimitHits: (await keyed(path.join(dir, "pids.events"))).get("max") ?? 0,
    pidsSaturated: saturated(await num(path.join(dir, "pids.current")), await num(path.join(dir, "pids.max"))),
    cpuUsageUsec: cpuStat.get("usage_usec"),
    cpuPeriods: cpuStat.get("nr_periods") ?? 0,
    cpuThrottledPeriods: cpuStat.get("nr_throttled") ?? 0,
    cpuThrottledUsec: cpuStat.get("throttled_usec") ?? 0,
  };
}
