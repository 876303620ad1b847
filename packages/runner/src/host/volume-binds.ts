import { constants as fsConstants } from "node:fs";
import { chmod, chown, lstat, mkdir, open, readlink } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { VolumeMount } from "../provider.ts";
import { run } from "./command.ts";

// Volumes on the host side of a sandbox start: the volume's subpath, resolved and created by root
// without ever following a symlink out of the volume (sandboxes write into volumes, so any name in
// one may be a symlink planted by another sandbox), bind-mounted under the sandbox's runtime dir,
// from where bubblewrap (running as the sandbox uid) binds it into the sandbox.
//
// Ownership: every sandbox has its own host uid, so a file one sandbox writes would be read-only
// to the next. Volume directories are setgid to the runner's volume group, sandboxes that mount
// volumes run with that group and umask 002: what one writes, the others can change.

/** Mode of volume directories the runner makes: setgid, group-writable, closed to others. */
const VOLUME_DIR_MODE = 0o2770;

/** Makes `root` a volume directory (idempotent). */
export async function prepareVolumeRoot(root: string, gid: number): Promise<void> {
  await mkdir(root, { recursive: true, mode: VOLUME_DIR_MODE });
  await chown(root, 0, gid);
  await chmod(root, VOLUME_DIR_MODE);
}

/**
 * Binds `v.root/v.subpath` at `at` (a directory made here). The directory is opened component by
 * component refusing symlinks, then the opened directory itself is mounted through its
 * /proc/<pid>/fd link (mount --no-canonicalize): what is mounted is what was checked, even if a
 * name is swapped for a symlink meanwhile.
 */
export async function bindVolume(v: VolumeMount, at: string, gid: number): Promise<void> {
  let dir = path.resolve(v.root);
  const rootStat = await lstat(dir).catch(() => undefined);
  if (!rootStat?.isDirectory()) throw errors.failedPrecondition(`volume directory ${path.basename(v.root)} is missing on this host`);
  for (const part of (v.subpath ?? "").split("/").filter((p) => p !== "" && p !== ".")) {
    if (part === "..") throw errors.invalidArgument("volume subpath must not contain '..'");
    dir = path.join(dir, part);
    const st = await lstat(dir).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return undefined;
      throw err;
    });
    if (st?.isSymbolicLink()) throw errors.failedPrecondition(`volume subpath ${v.subpath}: ${part} is a symbolic link`);
    if (st && !st.isDirectory()) throw errors.failedPrecondition(`volume subpath ${v.subpath}: ${part} is not a directory`);
    if (!st) {
      await mkdir(dir, { mode: VOLUME_DIR_MODE }).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "EEXIST") throw err;
      });
      const made = await lstat(dir);
      if (!made.isDirectory() || made.isSymbolicLink()) throw errors.failedPrecondition(`volume subpath ${v.subpath}: ${part} is not a directory`);
      if (made.uid === 0) {
        await chown(dir, 0, gid);
        await chmod(dir, VOLUME_DIR_MODE);
      }
    }
  }
  const fh = await open(dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY | fsConstants.O_NOFOLLOW);
  try {
    const fdLink = `/proc/${process.pid}/fd/${fh.fd}`;
    const opened = await readlink(fdLink);
    const root = path.resolve(v.root);
    if (opened !== root && !opened.startsWith(root + "/")) throw errors.failedPrecondition(`volume subpath ${v.subpath} leaves the volume`);
    // Traversable by the sandbox uid: bubblewrap, running as it, binds from here.
    await mkdir(path.dirname(at), { recursive: true, mode: 0o711 });
    await mkdir(at, { recursive: true, mode: 0o700 });
    await run("mount", ["--no-canonicalize", "--bind", fdLink, at]);
    await run("mount", ["--no-canonicalize", "-o", "remount,bind,nosuid,nodev", at]);
  } finally {
    await fh.close();
  }
}
