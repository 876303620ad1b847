import { chown, lstat, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import { constants } from "node:fs";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { safeMkdirp } from "../host/rootprep.ts";

// The sandbox user, written into a stopped container's writable layer (overlayfs's upper
// directory, on the host) before each start: its passwd and group lines name the host uid the
// container runs as, which changes when a layer is restored into another sandbox. The layer is
// the sandbox's own and may hold planted symlinks: nothing here follows one.

export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** The file as the container sees it: the upper layer's copy, else the snapshot's. */
async function mergedText(upper: string, rootfs: string, rel: string): Promise<string> {
  const up = path.join(upper, rel);
  const st = await lstat(up).catch(() => undefined);
  if (st) {
    if (!st.isFile()) throw errors.failedPrecondition(`the sandbox's /${rel} is not a regular file`);
    const fh = await open(up, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      return await fh.readFile("utf8");
    } finally {
      await fh.close();
    }
  }
  return readFile(path.join(rootfs, rel), "utf8").catch(() => "");
}

/** Replaces (or adds) the line starting with `name:`; written aside and renamed over. */
async function setLine(upper: string, rootfs: string, rel: string, name: string, line: string): Promise<void> {
  const lines = (await mergedText(upper, rootfs, rel)).split("\n").filter((l) => l !== "" && !l.startsWith(`${name}:`));
  lines.push(line);
  const target = path.join(upper, rel);
  const tmp = `${target}.sandbar-tmp`;
  await rm(tmp, { force: true }); // never write through a link planted there
  await writeFile(tmp, lines.join("\n") + "\n", { mode: 0o644, flag: "wx" });
  await rename(tmp, target);
}

export async function prepareUser(upper: string, rootfs: string, user: SandboxUser): Promise<void> {
  await safeMkdirp(upper, "etc");
  const shell = (await lstat(path.join(rootfs, "bin/bash")).catch(() => undefined)) ? "/bin/bash" : "/bin/sh";
  await setLine(upper, rootfs, "etc/passwd", user.name, `${user.name}:x:${user.uid}:${user.gid}::${user.home}:${shell}`);
  await setLine(upper, rootfs, "etc/group", user.name, `${user.name}:x:${user.gid}:`);
  const owner = { uid: user.uid, gid: user.gid };
  await safeMkdirp(upper, user.home, { ownedBelow: user.home, owner });
  const home = path.join(upper, user.home);
  const st = await lstat(home);
  if (st.uid !== owner.uid || st.gid !== owner.gid) await chown(home, owner.uid, owner.gid);
}

/** A shell file that exports `env` (sourced by the sandbox's init): single-quoted, so nothing expands. */
export function envFile(env: Record<string, string>): string {
  return Object.entries(env)
    .map(([k, v]) => `export ${k}='${v.replaceAll("'", `'\\''`)}'\n`)
    .join("");
}
