import { lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { run } from "../host/command.ts";
import { isErrno } from "../host/files.ts";

// Captured layers (DESIGN.md decision 19): a sandbox's writable layer copied, read-only, to
// `<dataDir>/layers/<id>/root`, with `uid` beside it (the host uid owning its files). A layer is
// made in `.tmp-<id>` and renamed into place, and removed by renaming it away first: a crash never
// leaves half a layer under its name (the scratch names are removed at the next open).
//
// The copy is `cp -a --reflink=auto`: whiteouts (0/0 character devices) and the
// trusted.overlay.opaque xattrs come along; on XFS or btrfs the file data is shared (reflink), on
// ext4 it is copied, so a capture's time grows with the size of the writable layer.

const SCRATCH = ".tmp-";
const OPAQUE = "trusted.overlay.opaque";

export class LayerStore {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = dir;
  }

  /** Makes the directory and removes what interrupted captures, squashes and removals left. */
  static async open(dir: string): Promise<LayerStore> {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    for (const name of await readdir(dir)) if (name.startsWith(SCRATCH)) await rm(path.join(dir, name), { recursive: true, force: true });
    return new LayerStore(dir);
  }

  /** The layer's root: the overlay lower. */
  root(id: string): string {
    return path.join(this.dir, id, "root");
  }

  async uid(id: string): Promise<number> {
    try {
      return Number((await readFile(path.join(this.dir, id, "uid"), "utf8")).trim());
    } catch (err) {
      if (isErrno(err, "ENOENT")) throw errors.failedPrecondition(`layer ${id} is not on this host`);
      throw err;
    }
  }

  async list(): Promise<Array<{ id: string; createdAt: Date }>> {
    const out: Array<{ id: string; createdAt: Date }> = [];
    for (const name of await readdir(this.dir)) {
      if (name.startsWith(SCRATCH)) continue;
      const st = await stat(path.join(this.dir, name)).catch(() => undefined);
      if (st) out.push({ id: name, createdAt: st.mtime });
    }
    return out;
  }

  /** Makes layer `id` owned by `uid`, `fill` writing its root; all or nothing. */
  async make(id: string, uid: number, fill: (root: string) => Promise<void>): Promise<void> {
    const final = path.join(this.dir, id);
    if (await exists(final)) throw errors.alreadyExists(`layer ${id} exists`);
    const scratch = path.join(this.dir, `${SCRATCH}${id}`);
    await rm(scratch, { recursive: true, force: true });
    await mkdir(scratch, { mode: 0o700 });
    try {
      // 0755: the sandbox uid walks the overlay's lowers through it (overlayfs checks the mounter's credentials only, but keep it plain).
      await mkdir(path.join(scratch, "root"), { mode: 0o755 });
      await fill(path.join(scratch, "root"));
      await writeFile(path.join(scratch, "uid"), `${uid}\n`, { mode: 0o600 });
      await rename(scratch, final);
    } catch (err) {
      await rm(scratch, { recursive: true, force: true }).catch(() => undefined);
      throw err;
    }
  }

  /** Renamed away first, then removed: never half a layer under its name. */
  async remove(id: string): Promise<void> {
    const away = path.join(this.dir, `${SCRATCH}rm-${id}-${process.pid}`);
    try {
      await rename(path.join(this.dir, id), away);
    } catch (err) {
      if (isErrno(err, "ENOENT")) return;
      throw err;
    }
    await rm(away, { recursive: true, force: true });
  }
}

async function exists(p: string): Promise<boolean> {
  return lstat(p).then(() => true, () => false);
}

/**
 * Copies a writable layer (`from`, an overlay upper) into `to` (an empty directory), whiteouts and
 * opaque directories kept; `skip` (paths relative to the root) are left out: the agent's own state.
 */
export async function copyLayer(from: string, to: string, skip: string[] = []): Promise<void> {
  await run("cp", ["-a", "--reflink=auto", "--", `${from}/.`, `${to}/`]);
  for (const s of skip) await rm(path.join(to, s), { recursive: true, force: true });
}

/**
 * Applies the overlay layer `from` on top of `to` as overlayfs would show it, the result still a
 * layer (whiteouts kept, for what lies below both): a whiteout or an opaque directory replaces
 * what `to` had there; a file replaces a directory and a directory a file. Then `cp -a` merges.
 */
async function applyLayer(from: string, to: string): Promise<void> {
  const opaque = await opaqueDirs(from);
  const overDirsOnWhiteouts: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const e of await readdir(path.join(from, rel), { withFileTypes: true })) {
      const r = path.join(rel, e.name);
      const below = await lstat(path.join(to, r)).catch(() => undefined);
      if (e.isDirectory()) {
        if (below && (opaque.has(r) || !below.isDirectory())) {
          if (!opaque.has(r) && isWhiteout(below)) overDirsOnWhiteouts.push(r);
          await rm(path.join(to, r), { recursive: true, force: true });
        }
        await walk(r);
      } else if (below?.isDirectory()) {
        await rm(path.join(to, r), { recursive: true, force: true });
      } else if (below && e.isCharacterDevice()) {
        await rm(path.join(to, r), { force: true });
      }
    }
  };
  await walk("");
  await run("cp", ["-a", "--reflink=auto", "--", `${from}/.`, `${to}/`]);
  // A directory made where a lower one was deleted hides that one's entries.
  for (const r of overDirsOnWhiteouts) await run("setfattr", ["-n", OPAQUE, "-v", "y", path.join(to, r)]);
}

function isWhiteout(st: { isCharacterDevice(): boolean; rdev: number }): boolean {
  return st.isCharacterDevice() && st.rdev === 0;
}

/** Directories of `root` marked opaque, relative to it. */
async function opaqueDirs(root: string): Promise<Set<string>> {
  const { stdout } = await run("getfattr", ["-R", "-P", "--absolute-names", "-d", "-m", `^${OPAQUE.replaceAll(".", "\\.")}$`, "--", root]);
  const out = new Set<string>();
  let file: string | undefined;
  for (const line of stdout.split("\n")) {
    if (line.startsWith("# file: ")) file = line.slice(8);
    else if (file && line.startsWith(`${OPAQUE}=`)) out.add(path.relative(root, file));
  }
  return out;
}

/** Squashes `layers` (roots, top first) into `to`: the bottom one copied, each above applied. */
export async function squashInto(layers: string[], to: string): Promise<void> {
  for (const l of [...layers].reverse()) await applyLayer(l, to);
}
