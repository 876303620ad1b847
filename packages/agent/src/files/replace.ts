import { open, rm } from "node:fs/promises";
import { createReadStream, createWriteStream } from "node:fs";
import { pipeline } from "node:stream/promises";
import * as path from "node:path";
import { randomUUID } from "node:crypto";

const READ_SIZE = 256 * 1024;

/**
 * Replaces every occurrence of pattern (literal bytes) in file, streaming
 * through a scratch file so a large file never sits in memory whole. The file
 * keeps its inode, owner and mode; it is not rewritten when nothing matches.
 * Returns the number of replacements.
 */
export async function replaceInFile(file: string, pattern: string, replacement: string, scratchDir: string): Promise<number> {
  const needle = Buffer.from(pattern, "utf8");
  const value = Buffer.from(replacement, "utf8");
  const src = await open(file, "r");
  const scratch = path.join(scratchDir, `replace-${randomUUID()}`);
  let count = 0;
  try {
    const st = await src.stat();
    if (st.isDirectory()) throw Object.assign(new Error(`is a directory: ${file}`), { code: "EISDIR" });
    const out = await open(scratch, "w", 0o600);
    try {
      const buf = Buffer.allocUnsafe(READ_SIZE);
      let carry = Buffer.alloc(0);
      for (;;) {
        const { bytesRead } = await src.read(buf, 0, READ_SIZE, null);
        const data = carry.length ? Buffer.concat([carry, buf.subarray(0, bytesRead)]) : Buffer.from(buf.subarray(0, bytesRead));
        const last = bytesRead === 0;
        // Everything before `safe` can be decided now; the rest may start a match that the next read completes.
        const safe = last ? data.length : Math.max(0, data.length - needle.length + 1);
        const parts: Buffer[] = [];
        let pos = 0;
        for (;;) {
          const at = data.indexOf(needle, pos);
          if (at < 0 || at >= safe) break;
          parts.push(data.subarray(pos, at), value);
          pos = at + needle.length;
          count++;
        }
        const flushTo = Math.max(pos, safe);
        parts.push(data.subarray(pos, flushTo));
        const chunk = Buffer.concat(parts);
        if (chunk.length) await out.write(chunk);
        carry = Buffer.from(data.subarray(flushTo));
        if (last) break;
      }
    } finally {
      await out.close();
    }
    // Truncate and rewrite in place: inode, owner and mode stay.
    if (count > 0) await pipeline(createReadStream(scratch), createWriteStream(file));
    return count;
  } finally {
    await src.close();
    await rm(scratch, { force: true });
  }
}
