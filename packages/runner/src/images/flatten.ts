import { chmodSync, copyFileSync, lchownSync, linkSync, lstatSync, mkdirSync, readdirSync, readlinkSync, rmSync, symlinkSync, type Stats } from "node:fs";
import { lstat, mkdir, opendir, rm } from "node:fs/promises";
import path from "node:path";

// An image's root: its layers merged, bottom to top, into one directory of hard links to the
// layers' files (so the bytes exist once, in the layer store). Directories and symlinks are made
// anew; whiteout devices and opaque xattrs are applied, never copied. Nothing here follows a
// symlink: parents are directories this function made itself.

export interface FlattenLayer {
  /** The layer's directory (overlayfs form). */
  dir: string;
  whiteouts: string[];
  opaque: string[];
}

async function lstatOrUndefined(p: string) {
  return lstat(p).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT" || err.code === "ENOTDIR") return undefined;
    throw err;
  });
}

/** Real directory chain from `root` to `rel`'s parent, or false (then there is nothing to remove). */
async function parentsAreDirs(root: string, rel: string): Promise<boolean> {
  let cur = root;
  const parts = rel.split("/").filter(Boolean);
  for (const c of parts.slice(0, -1)) {
    cur = path.join(cur, c);
    const st = await lstatOrUndefined(cur);
    if (!st?.isDirectory()) return false;
  }
  return true;
}

async function emptyDir(dir: string): Promise<void> {
  for await (const e of await opendir(dir)) await rm(path.join(dir, e.name), { recursive: true, force: true });
}

export async function flatten(layers: FlattenLayer[], target: string): Promise<void> {
  await mkdir(target, { mode: 0o755 });
  for (const layer of layers) {
    for (const d of layer.opaque) {
      if (d === "" || !(await parentsAreDirs(target, d))) continue;
      const st = await lstatOrUndefined(path.join(target, d));
      if (st?.isDirectory()) await emptyDir(path.join(target, d));
    }
    if (layer.opaque.includes("")) await emptyDir(target);
    for (const w of layer.whiteouts) {
      if (await parentsAreDirs(target, w)) await rm(path.join(target, w), { recursive: true, force: true });
    }
    await merge(layer.dir, target);
  }
}

// Synchronous syscalls (each microseconds; a root has tens of thousands), yielding to the event
// loop every few hundred entries so a runner serving other calls stays responsive.
let sinceYield = 0;
const yieldSometimes = async () => {
  if (++sinceYield % 256 === 0) await new Promise((r) => setImmediate(r));
};

async function merge(from: string, to: string): Promise<void> {
  const src = lstatSync(from);
  lchownSync(to, src.uid, src.gid);
  chmodSync(to, src.mode & 0o7777);
  for (const e of readdirSync(from)) {
    await yieldSometimes();
    const s = path.join(from, e);
    const d = path.join(to, e);
    const st = lstatSync(s);
    if (st.isCharacterDevice() && st.rdev === 0) continue; // a whiteout, applied above
    const existing = lstatOrUndefinedSync(d);
    if (st.isDirectory()) {
      if (existing && !existing.isDirectory()) rmSync(d, { recursive: true, force: true });
      if (!existing?.isDirectory()) mkdirSync(d, { mode: 0o755 });
      await merge(s, d);
      continue;
    }
    if (existing) rmSync(d, { recursive: true, force: true });
    if (st.isSymbolicLink()) {
      symlinkSync(readlinkSync(s), d);
      lchownSync(d, st.uid, st.gid);
    } else if (st.isFile()) {
      try {
        linkSync(s, d);
      } catch (err) {
        // An inode at its link limit: a copy costs bytes but keeps the image whole.
        if ((err as NodeJS.ErrnoException).code !== "EMLINK") throw err;
        copyFileSync(s, d);
        lchownSync(d, st.uid, st.gid);
        chmodSync(d, st.mode & 0o7777);
      }
    }
    // Anything else cannot be in a layer directory: unpack refuses it.
  }
}

function lstatOrUndefinedSync(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}
