import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** RLIMIT_NOFILE: how many descriptors a process may hold. */
export interface OpenFilesLimit {
  soft: number;
  hard: number;
  /** The soft limit before raiseOpenFilesLimit raised it. */
  raisedFrom?: number;
  /** Why it could not be raised. */
  error?: string;
}

/** A process's open-files limits, from /proc (Linux); undefined where that cannot be read. */
export function openFilesLimit(pid: number | "self" = "self"): OpenFilesLimit | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/limits`, "utf8");
  } catch {
    return undefined;
  }
  const m = /^Max open files\s+(\d+)\s+(\d+)/m.exec(text);
  return m ? { soft: Number(m[1]), hard: Number(m[2]) } : undefined;
}

/**
 * Raises this process's soft open-files limit to its hard limit; returns the limit in force.
 * Node does this itself before any script runs (and its children, PostgreSQL included, inherit
 * it): this acts only under a runtime that did not. Node has no setrlimit, so util-linux's
 * `prlimit` sets it from outside.
 */
export function raiseOpenFilesLimit(): OpenFilesLimit | undefined {
  const before = openFilesLimit();
  if (!before || before.soft >= before.hard) return before;
  const run = spawnSync("prlimit", ["--pid", String(process.pid), `--nofile=${before.hard}:${before.hard}`], { encoding: "utf8" });
  const after = openFilesLimit() ?? before;
  if (after.soft > before.soft) return { ...after, raisedFrom: before.soft };
  return { ...after, error: run.error?.message ?? (run.stderr.trim() || `prlimit exited with ${run.status}`) };
}
