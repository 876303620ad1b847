import { readdir } from "node:fs/promises";
import path from "node:path";

/**
 * A sandbox's cgroup under one hierarchy's root (e.g. /sys/fs/cgroup/memory): the directory named
 * by its id, a few levels down (the server's group, the runner's key). For tests and benchmarks
 * that read a sandbox's counters.
 */
export async function sandboxCgroup(root: string, id: string, depth = 4): Promise<string | undefined> {
  if (depth === 0) return undefined;
  for (const e of await readdir(root, { withFileTypes: true }).catch(() => [])) {
    if (!e.isDirectory()) continue;
    const p = path.join(root, e.name);
    if (e.name === id) return p;
    const deeper = await sandboxCgroup(p, id, depth - 1);
    if (deeper) return deeper;
  }
  return undefined;
}
