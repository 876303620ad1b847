import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { isSandboxId } from "../spec.ts";
import type { CgroupBackend } from "./cgroups/types.ts";
import { run } from "../host/command.ts";
import type { Layout } from "../host/layout.ts";
import { mountPoints } from "../host/mounts.ts";
import type { NetworkPart, SandboxNetworks } from "../host/network.ts";
import { listRecordIds, readRecord } from "../host/record.ts";

// What a runner that did not finish its work leaves on the host (a kill -9, a shutdown cut short,
// a data dir deleted under running sandboxes), found again by the next runner on the data dir
// (LinuxProvider.open, and control's reconcile with the sandboxes no row claims), removed and
// counted for the log: one line per kind.

/** What the sweep needs of the provider (some of it private to it, hence passed in). */
export interface LeftoverHost {
  layout: Layout;
  cgroups: CgroupBackend;
  networks: SandboxNetworks;
  log(line: string): void;
  /** Runs `fn` holding the sandbox's lock (what its start, stop and destroy hold). */
  locked<T>(id: string, fn: () => Promise<T>): Promise<T>;
  /** destroy's work, under the lock: processes, cgroup, mounts, network, dirs. */
  removeWhole(id: string, tally: LeftoverTally): Promise<void>;
  /** A stop's teardown of a sandbox nothing runs in, under the lock: its files and record stay. */
  tearDownIdle(id: string, tally: LeftoverTally): Promise<void>;
}

/**
 * Removes, and logs by kind: the sandboxes `unclaimed` names, whole (control's reconcile: no row
 * claims them, a warm pool of a run that was killed, say); the remains of sandboxes that have no
 * record any more (processes, mounts, cgroups, network: a data dir deleted under them); what a
 * sandbox that is not running still holds (a stop cut short); and loop devices backed by files
 * under the data dir, deleted ones too, that no mount uses. Sandboxes that run are left alone,
 * and each sandbox is handled under its lock, so it is safe while the runner works; one runner
 * process per data dir is assumed (another's create in progress would look like remains).
 * Returns the ids removed whole; a failure is logged and the rest done.
 */
export async function removeLeftovers(host: LeftoverHost, unclaimed: readonly string[]): Promise<string[]> {
  const L = host.layout;
  const tally = new LeftoverTally();
  const fail = (what: string) => (err: unknown) => host.log(`leftovers: ${what}: ${err instanceof Error ? err.message : String(err)}`);
  const loopsBefore = await loopDevicesUnder(L.dataDir);
  const dirs = await listRecordIds(L);
  const claims = (id: string) => readRecord(L, id).then((r) => r !== undefined, () => true); // an unreadable record still claims
  const recorded = new Set<string>();
  for (const id of dirs) if (await claims(id)) recorded.add(id);
  const table = await mountPoints();
  const [runtimeEntries, cgroups, namespaced] = await Promise.all([readdir(L.runtimeDir).catch(() => [] as string[]), host.cgroups.names(), host.networks.namespaced()]);
  const onHost = new Set([...dirs, ...runtimeEntries, ...idsBelow(L.runtimeDir, table), ...idsBelow(L.sandboxesDir, table), ...cgroups, ...namespaced].filter(isSandboxId));
  const whole = new Set(unclaimed);
  const removed: string[] = [];
  for (const id of [...whole, ...[...onHost].filter((x) => !recorded.has(x) && !whole.has(x))]) {
    const done = await host
      .locked(id, async () => {
        if (!whole.has(id) && (await claims(id))) return false; // created meanwhile: not remains
        await host.removeWhole(id, tally);
        return true;
      })
      .catch(fail(`sandbox ${id}`));
    if (!done) continue;
    (whole.has(id) ? tally.unclaimed : tally.unrecorded).push(id);
    removed.push(id);
  }
  // A recorded sandbox that is not running holds nothing on the host but its files.
  const holdsSomething = (id: string) => runtimeEntries.includes(id) || table.includes(L.diskMount(id)) || cgroups.includes(id) || namespaced.includes(id);
  for (const id of [...recorded].filter((x) => !whole.has(x) && holdsSomething(x))) {
    await host
      .locked(id, async () => {
        if ((await host.cgroups.pids(id)).length === 0) await host.tearDownIdle(id, tally);
      })
      .catch(fail(`sandbox ${id}`));
  }
  const used = await mountSources();
  for (const loop of await loopDevicesUnder(L.dataDir)) {
    if (used.has(loop.device)) continue;
    const detach = async () => {
      if (!(await mountSources()).has(loop.device)) await detachLoop(loop.device);
    };
    // Under its sandbox's lock: a start attaches the image a moment before it mounts it.
    const id = idsBelow(L.sandboxesDir, [loop.file]).find(isSandboxId);
    await (id ? host.locked(id, detach) : detach()).catch(fail(`loop device ${loop.device}`));
  }
  const attached = await loopDevicesUnder(L.dataDir);
  const still = new Set(attached.map((l) => `${l.device} ${l.file}`));
  for (const l of loopsBefore) {
    if (still.has(`${l.device} ${l.file}`)) continue;
    tally.add("loop devices");
    if (l.deleted) tally.deletedBacking++;
  }
  const mounted = await mountSources();
  const held = attached.filter((l) => !mounted.has(l.device));
  if (held.length > 0) host.log(`leftovers: ${held.length} loop device(s) still held outside this mount namespace, detached once freed: ${held.map((l) => `${l.device} (${l.file}${l.deleted ? ", deleted" : ""})`).join(", ")}`);
  for (const line of tally.lines()) host.log(`leftovers: ${line}`);
  return removed;
}

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
      out.push(`${kind === "processes" ? "killed" : "removed"} ${n} ${PLURAL[kind][n === 1 ? 0 : 1]}${deleted}`);
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
async function mountSources(): Promise<Set<string>> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  const out = new Set<string>();
  for (const line of text.split("\n")) {
    const after = line.split(" - ")[1];
    if (after) out.add(after.split(" ")[1]!);
  }
  return out;
}

/** Detaches a loop device no mount uses; one still held elsewhere is marked to go when freed. */
async function detachLoop(device: string): Promise<void> {
  await run("losetup", ["--detach", device]);
}

/** The first path segment below `root` of each path under it (the sandbox id, for the layout's roots). */
function idsBelow(root: string, paths: Iterable<string>): string[] {
  const prefix = root.endsWith("/") ? root : root + "/";
  const out = new Set<string>();
  for (const p of paths) if (p.startsWith(prefix)) out.add(p.slice(prefix.length).split(path.sep)[0]!);
  return [...out];
}
