import { readFileSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";

// Reads of the kernel's small text files (cgroup counters, /proc): a missing file is undefined,
// not an error, since a group or process can go at any moment.

export function isErrno(err: unknown, code: string): boolean {
  return typeof err === "object" && err !== null && (err as { code?: unknown }).code === code;
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

export async function readPids(file: string): Promise<number[]> {
  const t = await readText(file);
  if (!t) return [];
  return t
    .split("\n")
    .filter((l) => /^\d+$/.test(l))
    .map(Number);
}

/** Names of the directories in `dir` (none when it does not exist). */
export async function subdirs(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (err) {
    if (isErrno(err, "ENOENT")) return [];
    throw err;
  }
}
