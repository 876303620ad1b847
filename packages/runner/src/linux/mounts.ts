import { mkdir, open, rm, symlink } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { CommandError, run } from "../host/command.ts";
import { settleAll } from "../host/settle.ts";

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

/**
 * A sandbox's root: with `disk`, in one shell, its image attached and mounted (as mountDiskImage)
 * and the overlay's upper and work directories made on it, then the overlay.
 * One process for what was two (and two node round trips for the directories): each process the
 * runner starts costs more than one sh execs. What it mounted before a failure stays mounted:
 * the caller's teardown unmounts it.
 */
export async function mountRoot(d: OverlayDirs, disk?: { image: string; target: string }): Promise<void> {
  const opts = await overlayOptions(d);
  if (!disk) await run("mount", ["-t", "overlay", "overlay", "-o", opts, d.target], { cwd: d.linkDir });
  else await run("sh", ["-c", MOUNT_ROOT, "sandbar-mount", disk.image, disk.target, d.upper, d.work, opts, d.target], { cwd: d.linkDir });
}

/** The overlay's mount options, naming the layers by short links in `linkDir` (made here). */
async function overlayOptions(d: OverlayDirs): Promise<string> {
  await mkdir(d.linkDir, { recursive: true, mode: 0o700 });
  const alias = async (name: string, target: string) => {
    const at = path.join(d.linkDir, name);
    await rm(at, { force: true });
    await symlink(target, at);
    return name;
  };
  const [upper, work, ...lowers] = await Promise.all([alias("upper", checkMountPath(d.upper)), alias("work", checkMountPath(d.work)), ...d.lowers.map((l, i) => alias(`l${i}`, checkMountPath(l)))]);
  // nosuid + nodev: a restored archive may carry setuid files or device nodes; neither works here.
  // Relative names resolve against mount(8)'s working directory: the link dir.
  return `nosuid,nodev,lowerdir=${lowers.join(":")},upperdir=${upper},workdir=${work}`;
}

/**
 * Creates a sparse ext4 image of `bytes` size (no reserved blocks: the cap is what the sandbox gets).
 * `nice`: formatted at the lowest CPU priority (the disk pool's background refills).
 */
export async function makeDiskImage(image: string, bytes: number, options: { nice?: boolean } = {}): Promise<void> {
  const fh = await open(image, "wx", 0o600);
  // The overlay's upper and work dirs (Layout.upper/work) made by mkfs (-d: the file system's
  // root populated from a directory), so a first start has none to make.
  const root = path.join(path.dirname(image), `.${path.basename(image)}.root`);
  try {
    await fh.truncate(bytes);
    await rm(root, { recursive: true, force: true }); // a crash's, in a sandbox dir made again
    await mkdir(root, { mode: 0o755 });
    await settleAll([mkdir(path.join(root, "upper"), { mode: 0o755 }), mkdir(path.join(root, "work"), { mode: 0o700 })]);
    const mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d", root, image];
    await (options.nice ? run("nice", ["-n", "19", ...mkfs]) : run(mkfs[0]!, mkfs.slice(1)));
  } finally {
    await fh.close();
    await rm(root, { recursive: true, force: true });
  }
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
  // The loop device is set up here, in direct I/O (the sandbox's writes go from the image's page
  // cache straight to the host disk, instead of being copied a second time into the host's cache
  // of the image file: twice the memory, a second memcpy, a second writeback behind the first),
  // which mount(8) of util-linux 2.38 cannot ask for; switching after the mount costs an fsync
  // of the image and a queue freeze (~26 ms here). A host file system that cannot do direct I/O
  // leaves the device buffered, which works. --nooverlap: an image already attached (mounted
  // elsewhere) is given its device, never a second one (two ext4 instances on one file).
  // One shell for the three steps: each process node starts costs more than one sh execs.
  // Detaching a mounted device only marks it autoclear: it goes with the unmount, as with
  // mount -o loop; after a failed mount it goes at once. Two setups racing for one free device:
  // the loser fails busy, and tries again.
  // The image's file system can outlive its last unmount for a moment: a stopped sandbox's mount
  // namespace is released by the kernel asynchronously (deferred mntput), and until then a mount
  // of the image (an archive's read-only one right after a stop, on a loaded host) is refused as
  // "already mounted". That passes: it is tried again, for up to 30 s (5 s was seen to fall short
  // on a 2-core host running a test suite beside other work).
  const deadline = Date.now() + 30_000;
  for (let attempt = 0; ; attempt++) {
    try {
      await run("sh", ["-c", ATTACH_AND_MOUNT, "sandbar-mount", image, target, readonly ? "--read-only" : "", `nosuid,nodev${readonly ? ",ro" : ""}`]);
      return;
    } catch (err) {
      if (!(err instanceof CommandError && err.code === 32 && /already mounted/.test(err.stderr)) || Date.now() >= deadline) throw err;
      await new Promise((r) => setTimeout(r, Math.min(25 * 2 ** attempt, 250)));
    }
  }
}

/** attach_and_mount <image> <target> <losetup's --read-only or ""> <mount options> */
const ATTACH = `
attach_and_mount() {
  for try in 1 2 3 4 5; do
    # A device another setup took in between is not ours: its backing file is checked.
    dev=$(losetup --find --show --nooverlap --direct-io=on $3 "$1") && read -r bf < "/sys/block/\${dev#/dev/}/loop/backing_file" && [ "$bf" -ef "$1" ] && break
    [ $try = 5 ] && return 1
    sleep 0.05
  done
  mount -t ext4 -o "$4" "$dev" "$2" || { s=$?; losetup --detach "$dev"; return $s; }
  losetup --detach "$dev"
}
`;
const ATTACH_AND_MOUNT = `${ATTACH}attach_and_mount "$@"`;
/** <image> <disk mount> <upper> <work> <overlay options> <root> */
const MOUNT_ROOT = `${ATTACH}
attach_and_mount "$1" "$2" "" nosuid,nodev || exit
# Made by mkfs (makeDiskImage); an image of an older runner may lack them.
[ -d "$3" ] || mkdir -p -m 755 "$3" || exit
[ -d "$4" ] || mkdir -p -m 700 "$4" || exit
exec mount -t overlay overlay -o "$5" "$6"
`;

