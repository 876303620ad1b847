import { appendFile, chown, lstat, mkdir, open, readFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { isErrno } from "./files.ts";
import { settleAll } from "./settle.ts";

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
    let st = await lstatOrUndefined(cur);
    if (st === undefined) {
      // EEXIST: made meanwhile by a sibling mount point's call (the provider prepares them at
      // once); checked like any existing component below.
      const made = await mkdir(cur, { mode: options.mode ?? 0o755 }).then(() => true, (err: unknown) => {
        if (isErrno(err, "EEXIST")) return false;
        throw err;
      });
      const below = options.ownedBelow;
      if (made && options.owner && below && (inside === below || inside.startsWith(below + "/"))) {
        await chown(cur, options.owner.uid, options.owner.gid);
      }
      if (made) continue;
      st = await lstat(cur);
    }
    if (st.isSymbolicLink()) {
      throw errors.failedPrecondition(`the sandbox's ${inside} is a symbolic link; the runner will not follow it`);
    } else if (!st.isDirectory()) {
      throw errors.failedPrecondition(`the sandbox's ${inside} is not a directory`);
    }
  }
}

/** Makes sure an empty file exists at `rel` (a mount point for a file bind). */
async function safeTouch(root: string, rel: string, options: { ownedBelow?: string; owner?: Owner } = {}): Promise<void> {
  await safeMkdirp(root, path.dirname(rel), options);
  const p = path.join(root, rel);
  let st = await lstatOrUndefined(p);
  if (st === undefined) {
    try {
      await (await open(p, "wx", 0o644)).close();
    } catch (err) {
      if (!isErrno(err, "EEXIST")) throw err;
      st = await lstat(p); // made meanwhile for another bind of the same target
    }
  }
  if (st !== undefined && !st.isFile()) {
    throw errors.failedPrecondition(`the sandbox's ${path.join("/", rel)} exists and is not a regular file`);
  }
}

/** A mount point of the right kind (file or directory) for a bind of `source`. */
export async function ensureMountPoint(root: string, target: string, sourceIsDir: boolean, options: { ownedBelow?: string; owner?: Owner } = {}): Promise<void> {
  if (sourceIsDir) await safeMkdirp(root, target, options);
  else await safeTouch(root, target, options);
}

export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** The root's /etc/passwd entries by name (empty when it has none); never follows a symlink. */
export async function readPasswd(root: string): Promise<Map<string, { uid: number; gid: number; home: string }>> {
  const out = new Map<string, { uid: number; gid: number; home: string }>();
  const etc = await lstatOrUndefined(path.join(root, "etc"));
  const st = etc?.isDirectory() ? await lstatOrUndefined(path.join(root, "etc/passwd")) : undefined;
  if (!st?.isFile() || st.size > 4 * 1024 * 1024) return out;
  for (const line of (await readFile(path.join(root, "etc/passwd"), "utf8")).split("\n")) {
    const f = line.split(":");
    if (f.length < 7 || out.has(f[0]!) || !/^\d{1,10}$/.test(f[2]!) || !/^\d{1,10}$/.test(f[3]!)) continue;
    const uid = Number(f[2]);
    const gid = Number(f[3]);
    if (uid > 2 ** 31 - 2 || gid > 2 ** 31 - 2) continue;
    out.set(f[0]!, { uid, gid, home: f[5]! });
  }
  return out;
}

/**
 * Who `name` is inside the sandbox: root is uid 0; a user the root's /etc/passwd already has keeps
 * its uid and gid (an image's USER owns what the image made for it), with that home when it is
 * under /home; any other user is 1000:1000 with /home/<name>.
 */
export async function sandboxUser(root: string, name: string): Promise<SandboxUser> {
  if (name === "root") return { name, uid: 0, gid: 0, home: "/root" };
  const entry = (await readPasswd(root)).get(name);
  const fallbackHome = `/home/${name}`;
  if (!entry) return { name, uid: 1000, gid: 1000, home: fallbackHome };
  const home = entry.home.startsWith("/home/") && !entry.home.split("/").includes("..") ? path.posix.normalize(entry.home) : fallbackHome;
  return { name, uid: entry.uid, gid: entry.gid, home };
}

/** Adds `user` to /etc/passwd and /etc/group when missing, and creates the home directory. */
export async function ensureUser(root: string, user: { name: string; uid: number; gid: number; home: string }, hostOwner: Owner): Promise<void> {
  const [bash] = await settleAll([
    lstatOrUndefined(path.join(root, "bin/bash")),
    safeMkdirp(root, "etc"),
    // The home belongs to the sandbox user (host side: its host uid).
    safeMkdirp(root, user.home, { ownedBelow: user.home, owner: hostOwner }),
  ]);
  const shell = bash ? "/bin/bash" : "/bin/sh";
  await settleAll([
    appendLineIfMissing(root, "etc/passwd", user.name, `${user.name}:x:${user.uid}:${user.gid}::${user.home}:${shell}`),
    appendLineIfMissing(root, "etc/group", user.name, `${user.name}:x:${user.gid}:`),
  ]);
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
