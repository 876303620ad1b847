import { readFile } from "node:fs/promises";
import path from "node:path";
import type { CgroupBackend } from "./types.ts";
import type { V1Controller } from "./v1.ts";
import { CgroupV1 } from "./v1.ts";
import { CgroupV2 } from "./v2.ts";

// Picks the cgroup back end the host offers. v1 wins when memory, pids and cpu are bound to v1
// hierarchies (hybrid hosts such as ours keep only hugetlb on cgroup2); otherwise the unified
// hierarchy must offer them. Sandbox groups go below the runner's own cgroup, so a limit set
// on the runner's service also bounds its sandboxes.

interface Mount {
  root: string;
  point: string;
  fstype: string;
  superOptions: string[];
}

function parseMountinfo(text: string): Mount[] {
  const out: Mount[] = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    const [left, right] = line.split(" - ");
    const f = left.split(" ");
    const r = right.split(" ");
    out.push({ root: f[3], point: f[4], fstype: r[0], superOptions: (r[2] ?? "").split(",") });
  }
  return out;
}

/** controller name (or "" for the unified hierarchy) -> cgroup path of this process. */
function parseProcCgroup(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of text.split("\n")) {
    const m = /^\d+:([^:]*):(.*)$/.exec(line);
    if (!m) continue;
    if (m[1] === "") out.set("", m[2]);
    for (const c of m[1].split(",")) if (c) out.set(c, m[2]);
  }
  return out;
}

function ownDir(mount: Mount, own: string): string {
  const rel = own.startsWith(mount.root) ? path.relative(mount.root, own) : own;
  return path.join(mount.point, rel);
}

export interface DetectOptions {
  /** Parent group name for this runner's sandboxes. */
  group: string;
  /** Force a back end instead of detecting. */
  version?: "v1" | "v2";
}

export async function detectCgroups(options: DetectOptions): Promise<CgroupBackend> {
  const mounts = parseMountinfo(await readFile("/proc/self/mountinfo", "utf8"));
  const own = parseProcCgroup(await readFile("/proc/self/cgroup", "utf8"));

  const v1: Partial<Record<V1Controller, string>> = {};
  for (const c of ["memory", "pids", "cpu", "cpuacct", "freezer"] as const) {
    const m = mounts.find((x) => x.fstype === "cgroup" && x.superOptions.includes(c));
    const p = own.get(c);
    if (m && p !== undefined) v1[c] = ownDir(m, p);
  }
  const v1Usable = v1.memory !== undefined && v1.pids !== undefined && v1.cpu !== undefined;
  if (options.version !== "v2" && v1Usable) {
    return new CgroupV1({ hierarchies: { ...v1, memory: v1.memory!, pids: v1.pids!, cpu: v1.cpu! }, group: options.group });
  }
  if (options.version === "v1") throw new Error("cgroup v1 memory, pids and cpu hierarchies are not all mounted on this host");

  const unified = mounts.find((x) => x.fstype === "cgroup2");
  const p = own.get("");
  if (!unified || p === undefined) {
    throw new Error("no usable cgroups: neither v1 memory/pids/cpu hierarchies nor a cgroup2 mount were found");
  }
  const v2 = new CgroupV2({ base: ownDir(unified, p), group: options.group });
  await v2.prepare();
  return v2;
}
