import { execFile } from "node:child_process";
import { constants, type Stats } from "node:fs";
import { type FileHandle, lstat, open, readdir, readlink, realpath } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

// What a sandbox changed, read from its overlay layers instead of its whole root: a walk of the
// upper layer only, each entry looked up in the layers below (top first). A whiteout (a 0/0
// character device) is a deletion; an opaque directory (trusted.overlay.opaque=y) replaced the
// directory below, so what the layers below held there and the upper lacks is deleted too. A
// directory that exists below is reported only when its mode changed (overlayfs copies up every
// parent of a changed entry, so its presence alone says nothing) or it was replaced.
//
// The upper is written by the sandbox while we read it, as root on the host: a directory is
// opened without following a symlink and checked to be where we asked (a component swapped for a
// symlink would lead out of the layer), and its children are read through that open directory.
// An entry that vanishes under the walk is skipped.
//
// Order: depth first, each directory's names sorted, parents before their children; the same
// order `comparePaths` defines, so a page's last path is a cursor for the next.

export type ChangeKind = "added" | "modified" | "deleted";
export type ChangeType = "file" | "directory" | "symlink" | "other";

export interface Change {
  /** The path inside the sandbox (absolute, `/home/...`). */
  path: string;
  kind: ChangeKind;
  type: ChangeType;
  /** Bytes (files and symlinks); for deletions what the layers below held. */
  size: number;
  /** Permission bits and file type (st_mode); for deletions, the entry deleted. */
  mode: number;
  mtime: Date;
}

/** A change with where its content lies on the host (for archives and diffs). */
export interface LayerChange extends Change {
  /** The entry in the upper layer (absent for deletions). */
  upperPath?: string;
  /** The entry in the layers below (absent for additions). */
  lowerPath?: string;
}

/** The layers a changeset compares: the upper (what changed), then the layers below it, top first. */
export interface ChangeLayers {
  upper: string;
  lowers: string[];
  /** Sandbox paths (and what lies below them) that are the platform's, never the user's changes. */
  exclude?: readonly string[];
  /**
   * What the platform makes for the sandbox's user at start: its home (when the layers below had
   * none, left out itself; its contents are the user's), and one line of its user's in passwd and
   * group (those files are unchanged while that line is all they add to the ones below).
   */
  platformUser?: { name: string; home: string };
}

const USER_FILES = new Set(["/etc/passwd", "/etc/group"]);

/** Whether `upper` is `lower` plus one line of the user's (what rootprep's appendLineIfMissing writes). */
async function onlyUserLineAdded(upper: string, lower: string, name: string): Promise<boolean> {
  const [u, l] = await Promise.all([readSmall(upper), readSmall(lower)]);
  if (u === undefined || l === undefined) return false;
  const base = l === "" || l.endsWith("\n") ? l : l + "\n";
  if (!u.startsWith(base)) return false;
  const added = u.slice(base.length);
  return added.startsWith(`${name}:`) && added.endsWith("\n") && added.indexOf("\n") === added.length - 1;
}

async function readSmall(file: string): Promise<string | undefined> {
  const fh = await openLayerFile(file);
  if (!fh) return undefined;
  try {
    if ((await fh.stat()).size > 1 << 20) return undefined;
    return await fh.readFile("utf8");
  } finally {
    await fh.close();
  }
}

export interface ChangeFilter {
  /** Only paths at or below this sandbox path. */
  prefix?: string;
  /** Only paths after this one (a cursor: the last path of the previous page). */
  after?: string;
}

/** A sandbox path's segments; throws on a relative path or one with `.`/`..`. */
export function pathSegments(p: string): string[] {
  if (!p.startsWith("/")) throw new Error(`${JSON.stringify(p)} is not an absolute path`);
  const segs = p.split("/").filter((s) => s !== "");
  if (segs.some((s) => s === "." || s === "..")) throw new Error(`${JSON.stringify(p)} must not contain . or .. segments`);
  return segs;
}

/** The walk's order: segment by segment, a parent before its children. */
function comparePaths(a: readonly string[], b: readonly string[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
  return a.length - b.length;
}

function startsWith(segs: readonly string[], prefix: readonly string[]): boolean {
  return prefix.length <= segs.length && prefix.every((s, i) => segs[i] === s);
}

const isWhiteout = (st: Stats) => st.isCharacterDevice() && st.rdev === 0;

function typeOf(st: Stats): ChangeType {
  if (st.isFile()) return "file";
  if (st.isDirectory()) return "directory";
  if (st.isSymbolicLink()) return "symlink";
  return "other";
}

/** A directory of the upper, opened without following symlinks and checked to be `dir` itself. */
async function listUpperDir(dir: string): Promise<Map<string, Stats> | undefined> {
  let fh;
  try {
    fh = await open(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  } catch {
    return undefined; // vanished, or replaced by something that is not a directory
  }
  try {
    const via = `/proc/self/fd/${fh.fd}`;
    if ((await readlink(via)) !== dir) return undefined;
    const names = await readdir(via);
    const out = new Map<string, Stats>();
    await Promise.all(names.map(async (name) => {
      const st = await lstat(`${via}/${name}`).catch(() => undefined);
      if (st) out.set(name, st);
    }));
    return out;
  } catch {
    return undefined;
  } finally {
    await fh.close();
  }
}

/**
 * A regular file of a layer opened for reading: not through a symlink at its end (O_NOFOLLOW) nor
 * anywhere on its way (its open file must be `file` itself). Undefined when it vanished or changed.
 */
export async function openLayerFile(file: string): Promise<FileHandle | undefined> {
  const fh = await open(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(() => undefined);
  if (!fh) return undefined;
  const ok = await Promise.all([readlink(`/proc/self/fd/${fh.fd}`), fh.stat()]).then(([p, st]) => p === file && st.isFile(), () => false);
  if (ok) return fh;
  await fh.close();
  return undefined;
}

const run = promisify(execFile);

/** Which of `dirs` carry trusted.overlay.opaque=y (one getfattr for all; never follows symlinks). */
async function opaqueOf(dirs: string[]): Promise<Set<string>> {
  if (dirs.length === 0) return new Set();
  const { stdout } = await run("getfattr", ["-h", "--absolute-names", "-n", "trusted.overlay.opaque", "-e", "text", "--", ...dirs], { maxBuffer: 64 << 20 })
    .catch((err: { stdout?: string }) => ({ stdout: err.stdout ?? "" })); // exit 1 when some have none
  const out = new Set<string>();
  let file: string | undefined;
  for (const line of stdout.split("\n")) {
    if (line.startsWith("# file: ")) file = line.slice(8);
    else if (file && line === 'trusted.overlay.opaque="y"') out.add(file);
  }
  return out;
}

/** An entry in the layers below: the first layer holding `name` (a whiteout there hides it). */
interface Below {
  stats: Stats;
  host: string;
  /** When a directory: it and the directories of lower layers merged with it, top first. */
  dirs: string[];
}

async function lookupBelow(dirs: readonly string[], name: string): Promise<Below | undefined> {
  for (let i = 0; i < dirs.length; i++) {
    const host = path.join(dirs[i], name);
    const st = await lstat(host).catch(() => undefined);
    if (!st) continue;
    if (isWhiteout(st)) return undefined;
    if (!st.isDirectory()) return { stats: st, host, dirs: [] };
    const merged = [host];
    // Lower layers merge under it until one holds something else there or the one above is opaque.
    for (const d of dirs.slice(i + 1)) {
      const p = path.join(d, name);
      const s = await lstat(p).catch(() => undefined);
      if (!s) continue;
      if (!s.isDirectory() || isWhiteout(s)) break;
      const top = merged[merged.length - 1];
      if ((await opaqueOf([top])).has(top)) break;
      merged.push(p);
    }
    return { stats: st, host, dirs: merged };
  }
  return undefined;
}

/** Every name the directories below hold (whiteouts included; lookupBelow tells them apart). */
async function namesBelow(dirs: readonly string[]): Promise<string[]> {
  const all = new Set<string>();
  for (const d of dirs) for (const n of await readdir(d).catch(() => [])) all.add(n);
  return [...all];
}

function change(segs: readonly string[], kind: ChangeKind, st: Stats, where: { upperPath?: string; lowerPath?: string }): LayerChange {
  return { path: "/" + segs.join("/"), kind, type: typeOf(st), size: st.isDirectory() ? 0 : st.size, mode: st.mode, mtime: st.mtime, ...where };
}

/** The changes of `layers`, in walk order, filtered; stop early by returning from the loop. */
export async function* walkChanges(layers: ChangeLayers, filter: ChangeFilter = {}): AsyncGenerator<LayerChange> {
  const prefix = pathSegments(filter.prefix ?? "/");
  const after = filter.after ? pathSegments(filter.after) : undefined;
  const exclude = (layers.exclude ?? []).map(pathSegments);
  const upperRoot = await realpath(layers.upper);

  // Whether a path is reported (at or below the prefix, after the cursor) and whether its subtree can hold reported paths.
  const emits = (segs: string[]) => startsWith(segs, prefix) && (!after || comparePaths(segs, after) > 0);
  const enters = (segs: string[]) =>
    (startsWith(segs, prefix) || startsWith(prefix, segs)) && (!after || comparePaths(segs, after) > 0 || startsWith(after, segs));

  async function* dir(segs: string[], below: string[], replaced: boolean): AsyncGenerator<LayerChange> {
    const upperDir = path.join(upperRoot, ...segs);
    const upper = await listUpperDir(upperDir);
    if (!upper) return;
    const names = new Set(upper.keys());
    if (replaced) for (const n of await namesBelow(below)) names.add(n);
    const sorted = [...names].sort();
    const lowers = new Map<string, Below | undefined>();
    await Promise.all(sorted.map(async (n) => lowers.set(n, below.length > 0 ? await lookupBelow(below, n) : undefined)));
    // Opaque marks matter only on directories that also exist below.
    const opaque = await opaqueOf(sorted.filter((n) => upper.get(n)?.isDirectory() && lowers.get(n)?.stats.isDirectory()).map((n) => path.join(upperDir, n)));
    for (const name of sorted) {
      const child = [...segs, name];
      if (!enters(child) || exclude.some((e) => startsWith(child, e))) continue;
      const st = upper.get(name);
      const low = lowers.get(name);
      const upperPath = path.join(upperDir, name);
      if (!st) {
        // Only below, in a replaced directory: deleted (a directory once, not each of its entries).
        if (low && emits(child)) yield change(child, "deleted", low.stats, { lowerPath: low.host });
        continue;
      }
      if (isWhiteout(st)) {
        if (low && emits(child)) yield change(child, "deleted", low.stats, { lowerPath: low.host });
        continue;
      }
      const platformHome = layers.platformUser && st.isDirectory() && "/" + child.join("/") === layers.platformUser.home;
      if (!low) {
        if (emits(child) && !platformHome) yield change(child, "added", st, { upperPath });
        if (st.isDirectory()) yield* dir(child, [], false);
        continue;
      }
      if (!st.isDirectory()) {
        const user = layers.platformUser;
        if (user && st.isFile() && USER_FILES.has("/" + child.join("/")) && (await onlyUserLineAdded(upperPath, low.host, user.name))) continue;
        if (emits(child)) yield change(child, "modified", st, { upperPath, lowerPath: low.host });
        continue;
      }
      const lowerIsDir = low.stats.isDirectory();
      const isReplaced = !lowerIsDir || replaced || opaque.has(upperPath);
      if (emits(child) && (isReplaced || (st.mode & 0o7777) !== (low.stats.mode & 0o7777))) yield change(child, "modified", st, { upperPath, lowerPath: low.host });
      yield* dir(child, lowerIsDir ? low.dirs : [], isReplaced && lowerIsDir);
    }
  }

  const roots = await Promise.all(layers.lowers.map((l) => realpath(l)));
  yield* dir([], roots, (await opaqueOf([upperRoot])).has(upperRoot));
}
