import { createHash, randomBytes } from "node:crypto";
import { chmod, cp, lstat, mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";

// Files that an unprivileged user must read or run (PostgreSQL's binaries, run as `postgres` by
// the embedded database) cannot stay in a private directory (nvm or a checkout under /root). Such
// paths are copied once into a world-readable staging directory, named by their contents'
// identity, so that several servers on a host share one copy and a rebuilt package gets a new one.

/** Where unreachable runtime files are copied; root-owned, world-readable. */
export const DEFAULT_STAGING_DIR = "/usr/local/lib/sandbar/stage";

/** True when every directory above `p` is searchable by others and `p` itself is readable by them. */
export async function reachableByOthers(p: string): Promise<boolean> {
  try {
    if (((await stat(p)).mode & 0o004) === 0) return false;
    for (let dir = path.dirname(p); ; dir = path.dirname(dir)) {
      if (((await stat(dir)).mode & 0o001) === 0) return false;
      if (dir === "/") return true;
    }
  } catch {
    return false;
  }
}

/**
 * `p` itself when sandbox users can reach it, otherwise a copy of it (file or directory) under
 * `stagingDir`, made readable (and, where the source is, executable) by others.
 */
export async function reachablePath(p: string, stagingDir = DEFAULT_STAGING_DIR): Promise<string> {
  const source = path.resolve(p);
  if (await reachableByOthers(source)) return source;
  const target = path.join(stagingDir, `${path.basename(source)}-${await identity(source)}`);
  if (await stat(target).then(() => true, () => false)) return target;
  await mkdir(stagingDir, { recursive: true, mode: 0o755 });
  for (let dir = stagingDir; dir !== "/"; dir = path.dirname(dir)) await chmod(dir, (await stat(dir)).mode | 0o005);
  // Copy beside, then rename: concurrent servers never see a half-written copy.
  const tmp = `${target}.tmp-${randomBytes(4).toString("hex")}`;
  try {
    // Symlinks stay relative (shared libraries link to each other inside a package).
    await cp(source, tmp, { recursive: true, preserveTimestamps: true, verbatimSymlinks: true });
    await openUp(tmp);
    await rename(tmp, target);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    if (!(await stat(target).then(() => true, () => false))) throw err;
  }
  return target;
}

/** Size and mtime of every file below `p`: cheap, and changes whenever a build rewrites it. */
async function identity(p: string): Promise<string> {
  const h = createHash("sha256");
  const visit = async (file: string, rel: string): Promise<void> => {
    const st = await lstat(file);
    if (st.isDirectory()) {
      for (const name of (await readdir(file)).sort()) await visit(path.join(file, name), path.join(rel, name));
    } else {
      h.update(`${rel}\0${st.size}\0${st.mtimeMs}\n`);
    }
  };
  await visit(p, ".");
  return h.digest("hex").slice(0, 12);
}

/** Others may read everything, traverse directories and run what the owner can run. */
async function openUp(p: string): Promise<void> {
  const st = await lstat(p);
  if (st.isSymbolicLink()) return;
  if (st.isDirectory()) {
    await chmod(p, 0o755);
    for (const name of await readdir(p)) await openUp(path.join(p, name));
  } else {
    await chmod(p, st.mode & 0o100 ? 0o755 : 0o644);
  }
}
