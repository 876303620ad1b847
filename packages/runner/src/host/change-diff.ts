import { spawn } from "node:child_process";
import { Readable } from "node:stream";
import { type LayerChange, openLayerFile } from "./changes.ts";

// A changeset as a unified diff of its regular files (the layers below against the upper), made
// file by file as the reader pulls. Binary files (a NUL in their first 8 KiB, as git and diff
// judge) and files over the per-file bound are named, not compared. Directories, symlinks and
// other entries are left out (the list and the archive carry them).

/** Default bound of either side of one file's diff. */
export const DIFF_MAX_FILE_BYTES = 1 << 20;

type Side = { label: string; bytes: Buffer } | "vanished" | "too-large";

async function side(file: string | undefined, label: string, max: number): Promise<Side> {
  if (file === undefined) return { label: "/dev/null", bytes: Buffer.alloc(0) };
  const fh = await openLayerFile(file);
  if (!fh) return "vanished";
  try {
    const st = await fh.stat();
    if (st.size > max) return "too-large";
    const bytes = Buffer.alloc(st.size);
    const { bytesRead } = await fh.read(bytes, 0, st.size, 0);
    return { label, bytes: bytes.subarray(0, bytesRead) };
  } finally {
    await fh.close();
  }
}

const binary = (b: Buffer) => b.subarray(0, 8192).includes(0);

/** diff -u of two buffers, fed through pipes (never through paths a sandbox could swap). */
function unified(a: { label: string; bytes: Buffer }, b: { label: string; bytes: Buffer }): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn("diff", ["-u", "--label", a.label, "--label", b.label, "/dev/fd/3", "/dev/fd/4"], { stdio: ["ignore", "pipe", "pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr!.on("data", (c: Buffer) => (err += c.toString()));
    for (const [fd, bytes] of [[3, a.bytes], [4, b.bytes]] as const) {
      const pipe = child.stdio[fd];
      if (pipe && "end" in pipe) {
        pipe.on("error", () => undefined);
        pipe.end(bytes);
      }
    }
    child.on("error", reject);
    // 0: same, 1: different, 2: trouble.
    child.on("close", (code) => (code === 0 || code === 1 ? resolve(out) : reject(new Error(`diff failed: ${err.trim() || code}`))));
  });
}

async function fileDiff(c: LayerChange, max: number): Promise<string> {
  const p = c.path.slice(1);
  const [a, b] = await Promise.all([side(c.kind === "added" ? undefined : c.lowerPath, `a/${p}`, max), side(c.kind === "deleted" ? undefined : c.upperPath, `b/${p}`, max)]);
  if (a === "vanished" || b === "vanished") return "";
  if (a === "too-large" || b === "too-large") return `Files a/${p} and b/${p} differ (larger than ${max} bytes: not compared)\n`;
  if (binary(a.bytes) || binary(b.bytes)) return `Binary files ${a.label} and ${b.label} differ\n`;
  return unified(a, b);
}

async function* diffs(changes: AsyncIterable<LayerChange>, max: number): AsyncGenerator<Buffer> {
  for await (const c of changes) {
    const lowerIsFile = c.kind !== "added" && c.lowerPath !== undefined;
    // A file in a layer, or a deletion of one (the deleted entry's type is the one below).
    if (c.type !== "file" && !(c.kind === "modified" && lowerIsFile)) continue;
    const text = await fileDiff(c, max);
    if (text) yield Buffer.from(text);
  }
}

/** The changes' text files as one unified diff, pulled on demand. */
export function changesDiff(changes: AsyncIterable<LayerChange>, maxFileBytes = DIFF_MAX_FILE_BYTES): Readable {
  return Readable.from(diffs(changes, maxFileBytes), { objectMode: false });
}
