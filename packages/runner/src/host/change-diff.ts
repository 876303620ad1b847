import { spawn } from "node:child_process";
import type { FileHandle } from "node:fs/promises";
import { Readable } from "node:stream";
import { type LayerChange, openLayerFile } from "./changes.ts";

// A changeset as a unified diff of its regular files (the layers below against the upper), made
// file by file as the reader pulls. Binary files (a NUL in their first 8 KiB, as git and diff
// judge) and files over the per-file bound are named, not compared. Directories, symlinks and
// other entries are left out (the list and the archive carry them).

/** Default bound of either side of one file's diff. */
const DIFF_MAX_FILE_BYTES = 1 << 20;

/** One side of a file's diff: absent (/dev/null), or an open file and its first bytes. */
type Side = { label: string; fh?: FileHandle; head: Buffer; size: number };

async function side(file: string | undefined, label: string): Promise<Side | undefined> {
  if (file === undefined) return { label: "/dev/null", head: Buffer.alloc(0), size: 0 };
  const fh = await openLayerFile(file);
  if (!fh) return undefined;
  const size = (await fh.stat()).size;
  const head = Buffer.alloc(Math.min(size, 8192));
  const { bytesRead } = await fh.read(head, 0, head.length, 0);
  return { label, fh, head: head.subarray(0, bytesRead), size };
}

/**
 * diff -u of two sides, each handed to diff as an open file (its fd 3 or 4: never a path the
 * sandbox could swap for a symlink between our check and diff's open).
 */
function unified(a: Side, b: Side): Promise<string> {
  return new Promise((resolve, reject) => {
    const arg = (s: Side, fd: number) => (s.fh ? `/dev/fd/${fd}` : "/dev/null");
    const child = spawn("diff", ["-u", "--label", a.label, "--label", b.label, arg(a, 3), arg(b, 4)], { stdio: ["ignore", "pipe", "pipe", a.fh?.fd ?? "ignore", b.fh?.fd ?? "ignore"] });
    let out = "";
    let err = "";
    child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr!.on("data", (c: Buffer) => (err += c.toString()));
    child.on("error", reject);
    // 0: same, 1: different, 2: trouble.
    child.on("close", (code) => (code === 0 || code === 1 ? resolve(out) : reject(new Error(`diff failed: ${err.trim() || code}`))));
  });
}

/** What diff -u prints for a file added ("+") or deleted ("-") whole. */
function oneSided(label: string, sign: "+" | "-", bytes: Buffer): string {
  const text = bytes.toString("utf8");
  if (text === "") return "";
  const lines = text.split("\n");
  const complete = lines[lines.length - 1] === "";
  if (complete) lines.pop();
  const n = lines.length;
  const range = n === 1 ? "1" : `1,${n}`;
  const head = sign === "+" ? `--- /dev/null\n+++ ${label}\n@@ -0,0 +${range} @@\n` : `--- ${label}\n+++ /dev/null\n@@ -${range} +0,0 @@\n`;
  return head + lines.map((l) => sign + l + "\n").join("") + (complete ? "" : "\\ No newline at end of file\n");
}

async function fileDiff(c: LayerChange, max: number): Promise<string> {
  const p = c.path.slice(1);
  const [a, b] = await Promise.all([side(c.kind === "added" ? undefined : c.lowerPath, `a/${p}`), side(c.kind === "deleted" ? undefined : c.upperPath, `b/${p}`)]);
  try {
    if (!a || !b) return ""; // vanished since the walk saw it
    if (a.size > max || b.size > max) return `Files ${a.label} and ${b.label} differ (larger than ${max} bytes: not compared)\n`;
    if (a.head.includes(0) || b.head.includes(0)) return `Binary files ${a.label} and ${b.label} differ\n`;
    // A file on one side only is all one hunk: written here, without a diff process per file.
    if (!a.fh && b.fh) return oneSided(b.label, "+", await b.fh.readFile());
    if (a.fh && !b.fh) return oneSided(a.label, "-", await a.fh.readFile());
    return await unified(a, b);
  } finally {
    await Promise.all([a?.fh?.close(), b?.fh?.close()]);
  }
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
