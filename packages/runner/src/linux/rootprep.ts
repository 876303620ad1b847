import { appendFile, chown, lstat, mkdir, open, readFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { isErrno } from "./cgroups/types.ts";

// Prepares the mounted overlay root before launch, as host root: mount points for the runner's
// binds (bubblewrap, running unprivileged, cannot create them in root-owned directories), the
// user's home and passwd entry. The sandbox's own files may be hostile (a symlink planted at
// /opt -> /etc would make root write into the host), so every component is lstat'ed and
// symlinks are refused. No sandbox process runs while this happens, so nothing can race it.

export interface Owner {
  uid: number;
  gid: number;
}

function components(rel: string): string[] {
  return rel.split("/").filter((c) => c !== "" && c !== ".");
}

async function lstatOrUndefined(p: string) {
  try {
    return await lstat(p);
  } catch (err) {
    if (isErrno(err, "ENOENT")) return undefined;
    throw err;
  }
}

/**
 * mkdir -p of `rel` inside `root` without following symlinks. New directories are root-owned,
 * except those at or below `ownedBelow`, which get `owner`.
 */
export async function safeMkdirp(root: string, rel: string, options: { ownedBelow?: string; owner?: Owner; mode?: number } = {}): Promise<void> {
  let cur = root;
  let inside = "/";
  for (const c of components(rel)) {
    cur = path.join(cur, c);
    inside = path.join(inside, c);
    const st = await lstatOrUndefined(cur);
    if (st === undefined) {
      await mkdir(cur, { mode: options.mode ?? 0o755 });
      const below = options.ownedBelow;
      if (options.owner && below && (inside === below || inside.startsWith(below + "/"))) {
        await chown(cur, options.owner.uid, options.owner.gid);
      }
    } else if (st.isSymbolicLink()) {
      throw errors.failedPrecondition(`the sandbox's ${inside} is a symbolic link; the runner will not follow it`);
    } else if (!st.isDirectory()) {
      throw errors.failedPrecondition(`the sandbox's ${inside} is not a directory`);
    }
  }
}

/** Makes sure an empty file exists at `rel` (a mount point for a file bind). */
export async function safeTouch(root: string, rel: string, options: { ownedBelow?: string; owner?: Owner } = {}): Promise<void> {
  await safeMkdirp(root, path.dirname(rel), options);
  const p = path.join(root, rel);
  const st = await lstatOrUndefined(p);
  if (st === undefined) {
    await (await open(p, "wx", 0o644)).close();
  } else if (!st.isFile()) {
    throw errors.failedPrecondition(`the sandbox's ${path.join("/", rel)} exists and is not a regular file`);
  }
}

/** A mount point of the right kind (file or directory) for a bind of `source`. */
export async function ensureMountPoint(root: string, target: string, sourceIsDir: boolean, options: { ownedBelow?: string; owner?: Owner } = {}): Promise<void> {
  if (sourceIsDir) await safeMkdirp(root, target, options);
  else await safeTouch(root, target, options);
}

/** Adds `user` to /etc/passwd and /etc/group when missing, and creates the home directory. */
export async function ensureUser(root: string, user: { name: string; uid: number; gid: number; home: string }, hostOwner: Owner): Promise<void> {
  await safeMkdirp(root, "etc");
  const shell = (await lstatOrUndefined(path.join(root, "bin/bash"))) ? "/bin/bash" : "/bin/sh";
  await appendLineIfMissing(root, "etc/passwd", user.name, `${user.name}:x:${user.uid}:${user.gid}::${user.home}:${shell}`);
  await appendLineIfMissing(root, "etc/group", user.name, `${user.name}:x:${user.gid}:`);
  // The home belongs to the sandbox user (host side: its host uid).
  await safeMkdirp(root, user.home, { ownedBelow: user.home, owner: hostOwner });
  // A home the snapshot already had (e.g. /root) is handed over too; its contents are not.
  const home = path.join(root, user.home);
  const st = await lstat(home);
  if (st.uid !== hostOwner.uid || st.gid !== hostOwner.gid) await chown(home, hostOwner.uid, hostOwner.gid);
}

async function appendLineIfMissing(root: string, rel: string, name: string, line: string): Promise<void> {
  const p = path.join(root, rel);
  const st = await lstatOrUndefined(p);
  if (st && !st.isFile()) throw errors.failedPrecondition(`the sandbox's /${rel} is not a regular file`);
  const text = st ? await readFile(p, "utf8") : "";
  if (text.split("\n").some((l) => l.startsWith(`${name}:`))) return;
  await appendFile(p, (text === "" || text.endsWith("\n") ? "" : "\n") + line + "\n", { mode: 0o644 });
}
