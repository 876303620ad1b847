import { lstat } from "node:fs/promises";
import * as path from "node:path";
import { walk } from "./walk.ts";

/** Paths below root (and root itself) whose base name matches glob; reported as display + their path below root. */
export async function searchFiles(
  root: string,
  display: string,
  glob: RegExp,
  limit: number,
  signal?: AbortSignal,
): Promise<{ files: string[]; truncated: boolean }> {
  const files: string[] = [];
  let truncated = false;
  let rootStat;
  try {
    rootStat = await lstat(root);
  } catch {
    return { files, truncated };
  }
  if (glob.test(path.basename(root))) files.push(display);
  if (!rootStat.isDirectory()) return { files, truncated };
  for await (const { path: p, entry } of walk(root, signal)) {
    if (!glob.test(entry.name)) continue;
    if (files.length >= limit) {
      truncated = true;
      break;
    }
    files.push(path.join(display, path.relative(root, p)));
  }
  return { files, truncated };
}
