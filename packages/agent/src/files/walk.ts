import { opendir } from "node:fs/promises";
import type { Dirent } from "node:fs";
import * as path from "node:path";

/**
 * Every entry below root, depth first, without following symbolic links.
 * Unreadable directories are skipped. Stops when signal aborts.
 */
export async function* walk(root: string, signal?: AbortSignal): AsyncGenerator<{ path: string; entry: Dirent }> {
  const stack = [root];
  while (stack.length > 0) {
    if (signal?.aborted) return;
    const dir = stack.pop()!;
    let handle;
    try {
      handle = await opendir(dir, { bufferSize: 256 });
    } catch {
      continue;
    }
    const subdirs: string[] = [];
    for await (const entry of handle) {
      const p = path.join(dir, entry.name);
      yield { path: p, entry };
      if (entry.isDirectory()) subdirs.push(p);
    }
    // Keep a readable order: visit subdirectories in the order listed.
    for (let i = subdirs.length - 1; i >= 0; i--) stack.push(subdirs[i]);
  }
}
