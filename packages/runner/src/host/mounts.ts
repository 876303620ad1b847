import { readFile } from "node:fs/promises";
import { CommandError, run } from "./command.ts";

// The host's mount table, read and undone: what both providers tear down after a sandbox (its
// volume binds, the linux provider's overlay and disk image).

/**
 * Unmounts `target`, waiting while it is busy. A lazy unmount is the last resort: the file system
 * lives on unseen while anything holds it (a disk image's ext4 keeps its loop device, and a
 * read-only mount of the image, as an archive's pack makes, then fails "already mounted"), so
 * the wait is long enough for a loaded host to finish reaping the sandbox's processes.
 */
export async function unmount(target: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  for (let attempt = 0; ; attempt++) {
    try {
      await run("umount", [target]);
      return;
    } catch (err) {
      if (!(await isMountpoint(target))) return;
      if (Date.now() >= deadline) {
        // Still busy (a file held open from outside?): detach it so the sandbox can go.
        await run("umount", ["-l", target]).catch(() => undefined);
        if (await isMountpoint(target)) throw err;
        return;
      }
      if (!(err instanceof CommandError)) throw err;
      await new Promise((r) => setTimeout(r, Math.min(25 * 2 ** Math.floor(attempt / 4), 250)));
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
