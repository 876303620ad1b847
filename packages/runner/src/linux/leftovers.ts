import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { run } from "./command.ts";
import type { NetworkPart } from "./network.ts";

// What a runner that did not finish its work leaves on the host (a kill -9, a shutdown cut short,
// a data dir deleted under running sandboxes), found again by the next runner on the data dir
// (LinuxProvider.removeLeftovers) and counted for its log: one line per kind.

export type LeftoverKind = "processes" | "mounts" | "loop devices" | "cgroups" | NetworkPart;

const ORDER: LeftoverKind[] = ["processes", "mounts", "loop devices", "cgroups", "nftables chain", "veth", "network namespace"];
const PLURAL: Record<LeftoverKind, [string, string]> = {
  processes: ["process of a sandbox", "processes of sandboxes"],
  mounts: ["mount (overlay root, disk image or volume)", "mounts (overlay roots, disk images, volumes)"],
  "loop devices": ["loop device", "loop devices"],
  cgroups: ["sandbox cgroup", "sandbox cgroups"],
  "nftables chain": ["nftables chain", "nftables chains"],
  veth: ["veth", "veths"],
  "network namespace": ["network namespace", "network namespaces"],
};

export class LeftoverTally {
  readonly counts = new Map<LeftoverKind, number>();
  /** Sandboxes removed whole because nothing claims them (the caller said so). */
  readonly unclaimed: string[] = [];
  /** Sandboxes with no record whose remains were removed. */
  readonly unrecorded: string[] = [];
  /** Loop devices released whose backing file had been deleted. */
  deletedBacking = 0;

  add(kind: LeftoverKind, n = 1): void {
    if (n > 0) this.counts.set(kind, (this.counts.get(kind) ?? 0) + n);
  }

  get empty(): boolean {
    return this.counts.size === 0 && this.unclaimed.length === 0 && this.unrecorded.length === 0;
  }

  /** One line per kind removed, for the log. */
  lines(): string[] {
    const out: string[] = [];
    if (this.unclaimed.length) out.push(`removed ${this.unclaimed.length} sandbox(es) nothing claims: ${this.unclaimed.join(", ")}`);
    if (this.unrecorded.length) out.push(`removed the remains of ${this.unrecorded.length} sandbox(es) with no record: ${this.unrecorded.join(", ")}`);
    for (const kind of ORDER) {
      const n = this.counts.get(kind);
      if (!n) continue;
      const deleted = kind === "loop devices" && this.deletedBacking > 0 ? ` (${this.deletedBacking} of them backed by deleted files)` : "";
      out.push(`removed ${n} ${PLURAL[kind][n === 1 ? 0 : 1]}${deleted}`);
    }
    return out;
  }
}

export interface LoopDevice {
  /** /dev/loopN */
  device: string;
  /** Its backing file's path, " (deleted)" taken off. */
  file: string;
  deleted: boolean;
}

/** Attached loop devices whose backing file is, or was before it was deleted, under `dir`. */
export async function loopDevicesUnder(dir: string): Promise<LoopDevice[]> {
  const prefix = dir.endsWith("/") ? dir : dir + "/";
  const out: LoopDevice[] = [];
  for (const name of await readdir("/sys/block").catch(() => [] as string[])) {
    if (!/^loop\d+$/.test(name)) continue;
    // Present only while the device is attached.
    const backing = (await readFile(`/sys/block/${name}/loop/backing_file`, "utf8").catch(() => "")).replace(/\n$/, "");
    const deleted = backing.endsWith(" (deleted)");
    const file = deleted ? backing.slice(0, -" (deleted)".length) : backing;
    if (file.startsWith(prefix)) out.push({ device: `/dev/${name}`, file, deleted });
  }
  return out;
}

/** Sources of this mount namespace's mounts (a mounted loop device appears as /dev/loopN). */
export async function mountSources(): Promise<Set<string>> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  const out = new Set<string>();
  for (const line of text.split("\n")) {
    const after = line.split(" - ")[1];
    if (after) out.add(after.split(" ")[1]!);
  }
  return out;
}

/** Detaches a loop device no mount uses; one still held elsewhere is marked to go when freed. */
export async function detachLoop(device: string): Promise<void> {
  await run("losetup", ["--detach", device]);
}

/** The first path segment below `root` of each path under it (the sandbox id, for the layout's roots). */
export function idsBelow(root: string, paths: Iterable<string>): string[] {
  const prefix = root.endsWith("/") ? root : root + "/";
  const out = new Set<string>();
  for (const p of paths) if (p.startsWith(prefix)) out.add(p.slice(prefix.length).split(path.sep)[0]!);
  return [...out];
}
