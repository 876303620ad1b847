import { mkdir, open, readFile, rm, symlink } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { CommandError, run } from "./command.ts";

// Host-side mounts of a sandbox: the overlay root and, with a disk cap, the loop-mounted ext4
// image that holds the overlay's upper and work directories.

/** Paths that overlayfs' option parser or mount(8) would misread. */
function checkMountPath(p: string): string {
  if (/[,:\\\s]/.test(p)) {
    throw errors.invalidArgument(`path ${p} cannot be used in an overlay mount: it contains ',', ':', '\\' or whitespace`);
  }
  return p;
}

export interface OverlayDirs {
  /** Lower layers, top first. */
  lowers: string[];
  upper: string;
  work: string;
  target: string;
  /**
   * A private directory for short symlinks to the layers: the mount options (shown inside the
   * sandbox by findmnt and /proc/self/mountinfo) then name only `l0`, `l1`, `upper`, `work`, never
   * a host path.
   */
  linkDir: string;
}

export async function mountOverlay(d: OverlayDirs): Promise<void> {
  await mkdir(d.linkDir, { recursive: true, mode: 0o700 });
  const alias = async (name: string, target: string) => {
    const at = path.join(d.linkDir, name);
    await rm(at, { force: true });
    await symlink(target, at);
    return name;
  };
  const [upper, work, ...lowers] = await Promise.all([alias("upper", checkMountPath(d.upper)), alias("work", checkMountPath(d.work)), ...d.lowers.map((l, i) => alias(`l${i}`, checkMountPath(l)))]);
  const opts = `lowerdir=${lowers.join(":")},upperdir=${upper},workdir=${work}`;
  // nosuid + nodev: a restored archive may carry setuid files or device nodes; neither works here.
  // Relative names resolve against mount(8)'s working directory: the link dir.
  await run("mount", ["-t", "overlay", "overlay", "-o", `nosuid,nodev,${opts}`, d.target], { cwd: d.linkDir });
}

/**
 * Creates a sparse ext4 image of `bytes` size (no reserved blocks: the cap is what the sandbox gets).
 * `nice`: formatted at the lowest CPU priority (the disk pool's background refills).
 */
export async function makeDiskImage(image: string, bytes: number, options: { nice?: boolean } = {}): Promise<void> {
  const fh = await open(image, "wx", 0o600);
  try {
    await fh.truncate(bytes);
  } finally {
    await fh.close();
  }
  const mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", image];
  await (options.nice ? run("nice", ["-n", "19", ...mkfs]) : run(mkfs[0]!, mkfs.slice(1)));
}

/**
 * Grows an unmounted ext4 image to `bytes`: the file first (sparse), then the filesystem over it.
 * e2fsck -f first because resize2fs refuses a filesystem not checked since its last mount. A
 * failure after the truncate leaves a valid filesystem of the old size in a larger file.
 */
export async function growDiskImage(image: string, bytes: number): Promise<void> {
  const fh = await open(image, "r+");
  try {
    const { size } = await fh.stat();
    if (bytes < size) throw errors.invalidArgument(`the disk image cannot shrink (${size} to ${bytes} bytes)`);
    await fh.truncate(bytes);
  } finally {
    await fh.close();
  }
  try {
    await run("e2fsck", ["-f", "-p", image]);
  } catch (err) {
    // Exit 1: errors corrected; anything else leaves the filesystem as it was, at its old size.
    if (!(err instanceof CommandError && err.code === 1)) throw err;
  }
  await run("resize2fs", [image]);
}

export async function mountDiskImage(image: string, target: string, readonly = false): Promise<void> {
  // mount(8) sets the loop device up with autoclear, so unmounting frees it. Two loop setups
  // racing for the same free device make the loser fail with "already mounted or mount point
  // busy" (exit 32): that one is worth another try.
  for (let attempt = 0; ; attempt++) {
    try {
      // -t ext4: no probing of the image for its type (2-3 ms of mount(8)'s reads).
      await run("mount", ["-t", "ext4", "-o", `loop,nosuid,nodev${readonly ? ",ro" : ""}`, image, target]);
      return;
    } catch (err) {
      const busy = err instanceof CommandError && err.code === 32 && /already mounted or mount point busy/.test(err.stderr);
      if (!busy || attempt >= 4 || (await isMountpoint(target))) throw err;
      await new Promise((r) => setTimeout(r, 50 * (attempt + 1)));
    }
  }
}

export async function unmount(target: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await run("umount", [target]);
      return;
    } catch (err) {
      if (!(await isMountpoint(target))) return;
      if (attempt >= 20) {
        // Still busy (a file held open from outside?): detach it so the sandbox can go.
        await run("umount", ["-l", target]).catch(() => undefined);
        if (await isMountpoint(target)) throw err;
        return;
      }
      if (!(err instanceof CommandError)) throw err;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}

/** Mount points from /proc/self/mountinfo (octal escapes decoded). */
export async function mountPoints(): Promise<string[]> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => line.split(" ")[4].replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))));
}

export async function isMountpoint(p: string): Promise<boolean> {
  return (await mountPoints()).includes(p);
}

/** Mount points at or below `dir`. */
export async function mountsUnder(dir: string): Promise<string[]> {
  const prefix = dir.endsWith("/") ? dir : dir + "/";
  return (await mountPoints()).filter((m) => m === dir || m.startsWith(prefix));
}
