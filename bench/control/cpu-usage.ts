/**
 * CPU time of a server process and of its descendants (PostgreSQL for the control server),
 * from /proc. Per-request CPU is steadier than req/s on a busy or small machine: it does
 * not depend on what else gets the cores. Linux only; elsewhere `sample` returns undefined.
 */
import { readdirSync, readFileSync } from "node:fs";
import { platform } from "node:os";

export interface CpuSample {
  /** Milliseconds of user and system time of the process itself. */
  userMs: number;
  systemMs: number;
  /** Milliseconds of user + system time of its live descendants. */
  childrenMs: number;
}

// USER_HZ is 100 on every Linux Node runs on.
const TICK_MS = 10;

interface ProcStat {
  ppid: number;
  userMs: number;
  systemMs: number;
}

function readStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // Fields after the command name, which is in parentheses and may itself contain spaces.
  const f = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { ppid: Number(f[1]), userMs: Number(f[11]) * TICK_MS, systemMs: Number(f[12]) * TICK_MS };
}

export function sampleCpu(pid: number): CpuSample | undefined {
  if (platform() !== "linux") return undefined;
  const root = readStat(pid);
  if (!root) return undefined;
  const all = new Map<number, ProcStat>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const s = readStat(Number(name));
    if (s) all.set(Number(name), s);
  }
  const tree = new Set([pid]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [p, s] of all) if (!tree.has(p) && tree.has(s.ppid)) (tree.add(p), (grew = true));
  }
  let childrenMs = 0;
  for (const p of tree) if (p !== pid) childrenMs += all.get(p)!.userMs + all.get(p)!.systemMs;
  return { userMs: root.userMs, systemMs: root.systemMs, childrenMs };
}

/** Microseconds per request between two samples, or undefined when not measurable. */
export interface CpuPerRequest {
  userUs: number;
  systemUs: number;
  childrenUs: number;
}

export function cpuPerRequest(before: CpuSample | undefined, after: CpuSample | undefined, requests: number): CpuPerRequest | undefined {
  if (!before || !after || requests <= 0) return undefined;
  const per = (ms: number) => (ms * 1000) / requests;
  return {
    userUs: per(after.userMs - before.userMs),
    systemUs: per(after.systemMs - before.systemMs),
    // Descendants that exit during the run take their time with them: never below zero.
    childrenUs: Math.max(0, per(after.childrenMs - before.childrenMs)),
  };
}
