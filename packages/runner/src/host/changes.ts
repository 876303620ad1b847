import { execFile } from "node:child_process";
import { constants, type Stats } from "node:fs";
import { type FileHandle, lstat, open, readdir, readlink, realpath } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

// What a sandbox changed, read from its overlay layers instead of its whole root: a walk of the
// layers the sandbox's view and the view it is compared with do not share (the upper; with a
// checkpoint, also the captured layers above it and the checkpoint's own), each entry looked up in
// both views' layers (top first). A whiteout (a 0/0
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
  /** The entry as the sandbox sees it: in its upper or a layer (absent for deletions). */
  upperPath?: string;
  /** The entry as the compared view has it: in the layers below or the checkpoint's (absent for additions). */
  lowerPath?: string;
}

/** The layers a changeset compares: the upper (what changed), then the layers below it, top first. */
export interface ChangeLayers {
  upper: string;
  lowers: string[];
  /**
   * The stack the changes are against, top first (a checkpoint's captured layers, then its
   * image's root); default `lowers` (the sandbox's creation). Layers it shares with `lowers` are
   * read only where the other layers touch them.
   */
  since?: string[];
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

/** A directory of one view at a path: the layer directories overlay merges there, top first. */
type Merged = Array<{ layer: number; dir: string }>;

/** An entry of one view: the first layer holding it (a whiteout there hides it). */
interface Entry {
  stats: Stats;
  layer: number;
  host: string;
  /** When a directory: it and the directories of lower layers merged with it, top first. */
  dirs: Merged;
}

const sameLayers = (a: Merged, b: Merged) => a.length === b.length && a.every((d, i) => d.layer === b[i].layer);

/** Whether two entries are copies of one (a captured layer is cp -a of an upper: mode, owner, size and mtime kept): the quick check rsync makes. */
async function sameCopy(a: Entry, b: Entry): Promise<boolean> {
  const x = a.stats;
  const y = b.stats;
  if (x.mode !== y.mode || x.uid !== y.uid || x.gid !== y.gid) return false;
  if (x.isDirectory()) return true;
  if (x.size !== y.size || x.mtimeMs !== y.mtimeMs) return false;
  if (!x.isSymbolicLink()) return true;
  const [s, t] = await Promise.all([readlink(a.host).catch(() => undefined), readlink(b.host).catch(() => undefined)]);
  return s !== undefined && s === t;
}

function change(segs: readonly string[], kind: ChangeKind, st: Stats, where: { upperPath?: string; lowerPath?: string }): LayerChange {
  return { path: "/" + segs.join("/"), kind, type: typeOf(st), size: st.isDirectory() ? 0 : st.size, mode: st.mode, mtime: st.mtime, ...where };
}

/**
 * The changes of `layers`, in walk order, filtered; stop early by returning from the loop.
 *
 * Two views of the tree are compared: the sandbox's (`upper` over `lowers`) and the one the
 * changes are against (`since`, by default `lowers`). Layers both stacks hold are read only where
 * the other layers say something: at each directory only the names of the layer directories the
 * two views do not share are visited (what lies only in shared ones is the same in both), so a
 * read costs what the layers above the shared ones hold, never the whole root.
 */
export async function* walkChanges(layers: ChangeLayers, filter: ChangeFilter = {}): AsyncGenerator<LayerChange> {
  const prefix = pathSegments(filter.prefix ?? "/");
  const after = filter.after ? pathSegments(filter.after) : undefined;
  const exclude = (layers.exclude ?? []).map(pathSegments);

  // Every layer once (by its real path); a layer of both stacks is common to the views.
  const table: string[] = [];
  const indexOf = async (root: string) => {
    const real = await realpath(root);
    const i = table.indexOf(real);
    if (i >= 0) return i;
    table.push(real);
    return table.length - 1;
  };
  const curRoots: number[] = [];
  for (const l of [layers.upper, ...layers.lowers]) curRoots.push(await indexOf(l));
  const oldRoots: number[] = [];
  for (const l of layers.since ?? layers.lowers) oldRoots.push(await indexOf(l));
  const common = new Set(curRoots.filter((l) => oldRoots.includes(l)));

  // Whether a path is reported (at or below the prefix, after the cursor) and whether its subtree can hold reported paths.
  const emits = (segs: string[]) => startsWith(segs, prefix) && (!after || comparePaths(segs, after) > 0);
  const enters = (segs: string[]) =>
    (startsWith(segs, prefix) || startsWith(prefix, segs)) && (!after || comparePaths(segs, after) > 0 || startsWith(after, segs));

  /** Cuts each chain after its first opaque directory (one getfattr for the lot). */
  async function cutOpaque(chains: Merged[]): Promise<void> {
    const ask = [...new Set(chains.flatMap((c) => c.slice(0, -1).map((d) => d.dir)))];
    const opaque = new Set<string>();
    for (let i = 0; i < ask.length; i += 256) for (const d of await opaqueOf(ask.slice(i, i + 256))) opaque.add(d);
    for (const c of chains) {
      const at = c.findIndex((d) => opaque.has(d.dir));
      if (at >= 0) c.splice(at + 1);
    }
  }

  async function* dir(segs: string[], cur: Merged, old: Merged): AsyncGenerator<LayerChange> {
    // The suffix both views share; the rest ("own") is listed whole, the shared part looked up by name.
    let shared = 0;
    while (shared < cur.length && shared < old.length && cur[cur.length - 1 - shared].layer === old[old.length - 1 - shared].layer) shared++;
    const own = [...new Set([...cur.slice(0, cur.length - shared), ...old.slice(0, old.length - shared)].map((d) => d.dir))];
    const listings = new Map<string, Map<string, Stats>>();
    for (const d of own) {
      const listed = await listUpperDir(d);
      if (!listed) return; // vanished under the walk
      listings.set(d, listed);
    }
    const names = new Set<string>();
    for (const l of listings.values()) for (const n of l.keys()) names.add(n);
    const looked = new Map<string, Stats | undefined>();
    const statIn = async (d: string, name: string): Promise<Stats | undefined> => {
      const listed = listings.get(d);
      if (listed) return listed.get(name);
      const p = path.join(d, name);
      if (!looked.has(p)) looked.set(p, await lstat(p).catch(() => undefined));
      return looked.get(p);
    };
    const resolve = async (view: Merged, name: string): Promise<Entry | undefined> => {
      for (let i = 0; i < view.length; i++) {
        const st = await statIn(view[i].dir, name);
        if (!st) continue;
        if (isWhiteout(st)) return undefined;
        const host = path.join(view[i].dir, name);
        if (!st.isDirectory()) return { stats: st, layer: view[i].layer, host, dirs: [] };
        // Lower layers merge under it until one holds something else there (the opaque cut comes after).
        const dirs: Merged = [{ layer: view[i].layer, dir: host }];
        for (const below of view.slice(i + 1)) {
          const s = await statIn(below.dir, name);
          if (!s) continue;
          if (!s.isDirectory()) break;
          dirs.push({ layer: below.layer, dir: path.join(below.dir, name) });
        }
        return { stats: st, layer: view[i].layer, host, dirs };
      }
      return undefined;
    };

    const sorted = [...names].sort().filter((name) => {
      const child = [...segs, name];
      return enters(child) && !exclude.some((e) => startsWith(child, e));
    });
    const entries = new Map<string, [Entry | undefined, Entry | undefined]>();
    await Promise.all(sorted.map(async (n) => entries.set(n, await Promise.all([resolve(cur, n), resolve(old, n)]))));
    await cutOpaque([...entries.values()].flatMap(([c, o]) => [c?.dirs, o?.dirs].filter((d): d is Merged => d !== undefined && d.length > 1)));

    for (const name of sorted) {
      const child = [...segs, name];
      const [c, o] = entries.get(name)!;
      if (!c) {
        // Deleted: a directory once, not each of its entries.
        if (o && emits(child)) yield change(child, "deleted", o.stats, { lowerPath: o.host });
        continue;
      }
      if (o && c.layer === o.layer && sameLayers(c.dirs, o.dirs)) continue; // the same entry in both views
      if (!o) {
        const platformHome = layers.platformUser && c.stats.isDirectory() && "/" + child.join("/") === layers.platformUser.home;
        if (emits(child) && !platformHome) yield change(child, "added", c.stats, { upperPath: c.host });
        if (c.stats.isDirectory()) yield* dir(child, c.dirs, []);
        continue;
      }
      // Both copies of one entry (the two views' own layers, captured from the same upper): unchanged when they agree.
      const copies = !common.has(c.layer) && !common.has(o.layer) && (await sameCopy(c, o));
      if (!c.stats.isDirectory()) {
        if (copies) continue;
        const user = layers.platformUser;
        if (user && c.stats.isFile() && o.stats.isFile() && USER_FILES.has("/" + child.join("/")) && (await onlyUserLineAdded(c.host, o.host, user.name))) continue;
        if (emits(child)) yield change(child, "modified", c.stats, { upperPath: c.host, lowerPath: o.host });
        continue;
      }
      if (!o.stats.isDirectory()) {
        if (emits(child)) yield change(child, "modified", c.stats, { upperPath: c.host, lowerPath: o.host });
        yield* dir(child, c.dirs, []);
        continue;
      }
      // Replaced (rm -rf, mkdir: an opaque directory) when the views merge different common layers there.
      const commonOf = (m: Merged) => m.filter((d) => common.has(d.layer)).map((d) => d.layer).join(",");
      const replaced = commonOf(c.dirs) !== commonOf(o.dirs);
      if (emits(child) && (replaced || (c.stats.mode & 0o7777) !== (o.stats.mode & 0o7777))) yield change(child, "modified", c.stats, { upperPath: c.host, lowerPath: o.host });
      yield* dir(child, c.dirs, o.dirs);
    }
  }

  const rootView = async (roots: number[]): Promise<Merged> => {
    const view = roots.map((layer) => ({ layer, dir: table[layer] }));
    await cutOpaque([view]);
    return view;
  };
  yield* dir([], await rootView(curRoots), await rootView(oldRoots));
}
