import { open, stat } from "node:fs/promises";
import * as path from "node:path";
import { walk } from "./walk.ts";

export interface FindMatch {
  file: string;
  line: number;
  content: string;
}

/** Longest line content returned; longer lines are cut (the match still counts). */
const MAX_CONTENT = 64 * 1024;
const READ_SIZE = 64 * 1024;

/** A file is binary when its first 512 bytes hold a NUL. */
function looksBinary(head: Uint8Array): boolean {
  return head.subarray(0, 512).includes(0);
}

/**
 * Calls onMatch for every line of the file containing needle (bytes), reading
 * in chunks so a large file never sits in memory whole. Returns false to stop.
 */
async function scanFile(
  file: string,
  needle: Buffer,
  onMatch: (line: number, content: Buffer) => boolean,
): Promise<boolean> {
  let fh;
  try {
    fh = await open(file, "r");
  } catch {
    return true;
  }
  try {
    let lineNo = 1;
    // The current line's bytes so far; past MAX_CONTENT only whether it matched is tracked.
    let pending: Buffer[] = [];
    let pendingLen = 0;
    let overflowMatched = false;
    let first = true;
    const buf = Buffer.allocUnsafe(READ_SIZE);
    const finishLine = (tail: Buffer): boolean => {
      const line = pendingLen === 0 ? tail : Buffer.concat([...pending, tail]);
      pending = [];
      pendingLen = 0;
      const matched = overflowMatched || line.includes(needle);
      overflowMatched = false;
      const no = lineNo++;
      if (matched) {
        let content = line.length > MAX_CONTENT ? line.subarray(0, MAX_CONTENT) : line;
        if (content.at(-1) === 0x0d) content = content.subarray(0, -1);
        return onMatch(no, content);
      }
      return true;
    };
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, READ_SIZE, null);
      if (bytesRead === 0) break;
      const chunk = buf.subarray(0, bytesRead);
      if (first) {
        first = false;
        if (looksBinary(chunk)) return true;
      }
      let start = 0;
      for (;;) {
        const nl = chunk.indexOf(0x0a, start);
        if (nl < 0) break;
        if (!finishLine(Buffer.from(chunk.subarray(start, nl)))) return false;
        start = nl + 1;
      }
      if (start < chunk.length) {
        const rest = Buffer.from(chunk.subarray(start));
        if (pendingLen + rest.length > MAX_CONTENT + needle.length) {
          // Keep memory bounded on huge lines: remember a match, keep only the head and a tail for boundary matches.
          const all = Buffer.concat([...pending, rest]);
          if (all.includes(needle)) overflowMatched = true;
          const keep = Buffer.concat([all.subarray(0, MAX_CONTENT), all.subarray(Math.max(MAX_CONTENT, all.length - needle.length + 1))]);
          pending = [keep];
          pendingLen = keep.length;
        } else {
          pending.push(rest);
          pendingLen += rest.length;
        }
      }
    }
    if (pendingLen > 0) return finishLine(Buffer.alloc(0));
    return true;
  } finally {
    await fh.close();
  }
}

/**
 * Lines containing pattern (a literal) in the regular files below root,
 * binary files skipped. Paths are reported as display + their path below root.
 */
export async function findInFiles(
  root: string,
  display: string,
  pattern: string,
  limit: number,
  signal?: AbortSignal,
): Promise<{ matches: FindMatch[]; truncated: boolean }> {
  const needle = Buffer.from(pattern, "utf8");
  const matches: FindMatch[] = [];
  let truncated = false;
  const shown = (p: string) => path.join(display, path.relative(root, p));
  const onMatchFor = (file: string) => (line: number, content: Buffer) => {
    if (matches.length >= limit) {
      truncated = true;
      return false;
    }
    matches.push({ file, line, content: content.toString("utf8") });
    return true;
  };
  let rootIsFile = false;
  try {
    rootIsFile = (await stat(root)).isFile();
  } catch {
    return { matches, truncated };
  }
  if (rootIsFile) {
    await scanFile(root, needle, onMatchFor(display));
    return { matches, truncated };
  }
  for await (const { path: p, entry } of walk(root, signal)) {
    if (!entry.isFile()) continue;
    if (!(await scanFile(p, needle, onMatchFor(shown(p))))) break;
  }
  return { matches, truncated };
}
