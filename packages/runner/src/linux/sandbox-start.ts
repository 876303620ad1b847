import { chown, mkdir, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { ConnectError, errors } from "@sandbar/protocol";
import type { SandboxSpec } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { memoryBytesOf } from "../spec.ts";
import { INIT_SCRIPT, initArgs } from "../host/init-script.ts";
import type { Layout } from "../host/layout.ts";
import type { SandboxRecord } from "../host/record.ts";
import { type SandboxHost, sandboxEnv } from "../host/sandbox-host.ts";
import { settleAll } from "../host/settle.ts";
import { bindVolume, prepareVolumeRoot } from "../host/volume-binds.ts";
import { bwrapOptions, type BwrapMount } from "./bwrap.ts";
import type { CgroupBackend, UserLimits } from "./cgroups/types.ts";
import { AGENT_OOM_SCORE_ADJ, launch, type LaunchedProcess, type LaunchOptions } from "./launcher.ts";
import type { MeminfoRefresher } from "./meminfo-refresher.ts";
import { mountRoot } from "./mounts.ts";
import { ensureMountPoint, ensureUser, sandboxUser } from "../host/rootprep.ts";
import type { SharedToolsLayers } from "./tools-layer.ts";

// The linux provider's start, up to a launched first process: runtime dirs, the overlay root
// (over a disk image when capped), the user and mount points in it, the cgroup, the network, then
// bubblewrap through the launcher. The provider waits for the agent's socket afterwards.

export type StartPhase = "cleanup" | "dirs" | "overlay" | "root-prep" | "cgroup" | "network" | "spawn" | "socket";

export interface Tools {
  bwrap: string;
  setpriv: string;
  /** Host path of the shell used as the sandbox's pid 1. */
  initSh: string;
  /** The compiled seccomp program every sandbox process runs under. */
  seccompFile: string;
  nsenter?: string;
}

/** What a start uses of the provider. */
export interface StartContext {
  host: SandboxHost;
  cgroups: CgroupBackend;
  tools: Tools;
  toolsLayers: SharedToolsLayers;
  meminfo: MeminfoRefresher;
  /** Host path of a captured layer's root (layers.ts). */
  layerRoot(layerId: string): string;
  /** How the first process ended (undefined: a new one starts). */
  onExit(id: string, exit: { code: number | null; signal: string | null } | undefined): void;
  teardown(id: string): Promise<void>;
}

const CPU_PERIOD_US = 100_000;
/** Pids and memory the user leaf leaves to the agent (bounded to a share of small sandboxes). */
const AGENT_PIDS_RESERVE = 64;
const AGENT_MEMORY_RESERVE = 64 * 2 ** 20;

/** The user leaf's budget: the totals minus the agent's reserve. */
function userLimitsOf(memoryBytes: number, pidsLimit: number): UserLimits {
  const pidsReserve = Math.min(AGENT_PIDS_RESERVE, Math.floor(pidsLimit / 2));
  const memoryReserve = Math.min(AGENT_MEMORY_RESERVE, Math.floor(memoryBytes / 4));
  return { pidsMax: Math.max(1, pidsLimit - pidsReserve), memoryBytes: memoryBytes - memoryReserve };
}

/** Creates the sandbox's cgroup, or resets the limits of the one it runs in, from its spec. */
export async function applyLimits(cgroups: CgroupBackend, spec: SandboxSpec, hostUid: number): Promise<UserLimits> {
  const memoryBytes = memoryBytesOf(spec);
  const userLimits = userLimitsOf(memoryBytes, spec.pidsLimit);
  await cgroups.create(spec.id, { memoryBytes, pidsMax: spec.pidsLimit, cpuPeriodUs: CPU_PERIOD_US, cpuQuotaUs: Math.max(1000, Math.round(spec.cpu * CPU_PERIOD_US)) }, userLimits, hostUid);
  return userLimits;
}

/** The sandbox's /proc/meminfo view (meminfo-refresher.ts); it goes with the runtime dir. */
export function meminfoFile(layout: Layout, id: string): string {
  return path.join(layout.runtime(id), "meminfo");
}

export async function prepareAndLaunch(ctx: StartContext, rec: SandboxRecord, phase: (p: StartPhase) => void): Promise<LaunchedProcess> {
  const { spec, hostUid } = rec;
  const id = spec.id;
  const { host, cgroups } = ctx;
  const L = host.layout;
  const hasDisk = spec.diskGiB !== undefined;
  const owner = { uid: hostUid, gid: hostUid };
  // The cgroup and the tools layer need nothing of the mounts: made while the mounts are.
  const limits = applyLimits(cgroups, spec, hostUid);
  limits.catch(() => undefined); // awaited below; a failure before then must not go unhandled
  try {
    const tools = ctx.toolsLayers.layer({ initSh: ctx.tools.initSh, node: spec.init.node, bundle: spec.init.bundle, main: spec.init.main });
    tools.catch(() => undefined);
    await settleAll([
      (async () => {
        // Runtime dirs: traversable by the sandbox uid, writable only by root (the run dir by the sandbox).
        await host.makeRuntimeDirs(id);
        await settleAll([mkdir(L.rootMount(id), { recursive: true }), mkdir(L.runDir(id), { recursive: true, mode: 0o700 }).then(() => chown(L.runDir(id), hostUid, hostUid))]);
        await rm(L.socket(id), { force: true });
      })(),
      hasDisk ? mkdir(L.diskMount(id), { recursive: true, mode: 0o700 }) : Promise.resolve(),
    ]);
    phase("dirs");
    const { dir: toolsDir, agentEntry } = await tools;
    // The disk image (its upper and work dirs made on it) and the overlay, in one process.
    // Captured layers (a fork's, a running sandbox's snapshot's) sit between the upper and the snapshot.
    const layers = (spec.layers ?? []).map((l) => ctx.layerRoot(l));
    for (const [i, l] of layers.entries()) await stat(l).catch(() => Promise.reject(errors.failedPrecondition(`layer ${spec.layers![i]} of sandbox ${id} is not on this host`)));
    const overlay = { lowers: [toolsDir, ...layers, spec.rootfs], upper: L.upper(id, hasDisk), work: L.work(id, hasDisk), target: L.rootMount(id), linkDir: path.join(L.sandboxDir(id), "layers") };
    await mountRoot(overlay, hasDisk ? { image: L.diskImage(id), target: L.diskMount(id) } : undefined);

    phase("overlay");
    const root = L.rootMount(id);
    const user = await sandboxUser(root, spec.user!);

    // The user's entries and home and the mount points are made at once (rootprep tolerates
    // siblings making a shared parent); `mounts` keeps the spec's order, which bubblewrap applies.
    const mounts: BwrapMount[] = [];
    const points: Promise<void>[] = [ensureUser(root, user, owner)];
    const addMount = (source: string, target: string, readonly: boolean, ready: Promise<void> = Promise.resolve()) => {
      mounts.push({ source, target, readonly });
      points.push(ready.then(() => stat(source)).then((st) => ensureMountPoint(root, target, st.isDirectory(), { ownedBelow: user.home, owner })));
    };
    for (const m of spec.mounts ?? []) addMount(m.source, m.target, m.readonly !== false);
    // Volumes are bound one after another (two may share a volume root), in the points' batch:
    // a refused volume fails the start only once nothing else is still working on the root.
    let volumes = Promise.resolve();
    for (const [i, v] of (spec.volumes ?? []).entries()) {
      const at = path.join(L.runtime(id), "volumes", String(i));
      volumes = volumes.then(async () => {
        await prepareVolumeRoot(v.root, host.volumeGid);
        await bindVolume(v, at, host.volumeGid);
      });
      addMount(at, v.target, false, volumes);
    }
    addMount(L.runDir(id), SANDBOX_PATHS.runDir, false);
    // The user leaf's procs files (one per v1 hierarchy), writable by the sandbox uid only: the
    // agent moves what it starts for the user there. Created below, bound once they exist.
    const userProcs = cgroups.userProcsFiles(id).map((source, i) => ({ source, target: path.join(SANDBOX_PATHS.userCgroupDir, String(i)) }));
    for (const u of userProcs) points.push(ensureMountPoint(root, u.target, false, { ownedBelow: user.home, owner }));
    await settleAll(points);

    const command = [SANDBOX_PATHS.init, "-c", INIT_SCRIPT, ...initArgs(SANDBOX_PATHS.agentRestarts), SANDBOX_PATHS.node, ...(spec.init.nodeArgs ?? []), agentEntry, "--socket", SANDBOX_PATHS.agentSocket, "--state-dir", SANDBOX_PATHS.agentState];
    for (const u of userProcs) command.push("--user-cgroup", u.target);
    if (spec.init.secret !== undefined) {
      const secretFile = path.join(L.runDir(id), "secret");
      await writeFile(secretFile, spec.init.secret, { mode: 0o600 });
      await chown(secretFile, hostUid, hostUid);
      command.push("--secret-file", SANDBOX_PATHS.secretFile);
    }
    command.push(...(spec.init.args ?? []));
    phase("root-prep");

    const userLimits = await limits;
    for (const u of userProcs) mounts.push({ source: u.source, target: u.target, readonly: false });
    // The sandbox group's memory in /proc/meminfo's format (free, top, os.totalmem), bound
    // over the kernel's (bwrap applies mounts after its --proc); refreshed until the teardown.
    ctx.meminfo.create(id, meminfoFile(L, id));
    mounts.push({ source: meminfoFile(L, id), target: "/proc/meminfo", readonly: true });

    phase("cgroup");
    // `nproc` (and OpenMP, OpenBLAS) honour OMP_NUM_THREADS: the CPU quota rather than the host's CPUs.
    const env = sandboxEnv(spec, user);
    // /dev/shm is memory charged to the user leaf that no OOM kill gives back: half its budget.
    const shmBytes = Math.floor(userLimits.memoryBytes / 2);
    const netns = await setUpNetwork(ctx, spec, mounts);
    phase("network");
    const options = bwrapOptions({ root, hostname: id, uid: user.uid, gid: user.gid, env, cwd: spec.workdir ?? user.home, mounts, shmBytes, shareNet: netns !== undefined });
    ctx.onExit(id, undefined);
    const child = await launch({
      bwrap: ctx.tools.bwrap, setpriv: ctx.tools.setpriv, hostUid, hostGid: hostUid, procsFiles: cgroups.procsFiles(id), bwrapOptions: options, command,
      logFile: L.initLog(id), seccompFile: ctx.tools.seccompFile, netns, oomScoreAdj: AGENT_OOM_SCORE_ADJ, ...(spec.volumes?.length ? { groups: [host.volumeGid], umask: 0o002 } : {}),
    });
    child.on("exit", (code, signal) => ctx.onExit(id, { code, signal }));
    phase("spawn");
    return child;
  } catch (err) {
    await limits.catch(() => undefined); // settled before the teardown removes what it made
    await ctx.teardown(id).catch(() => undefined);
    if (err instanceof ConnectError) throw err;
    throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
  }
}

/**
 * The sandbox's network namespace, veth pair and policy when it has egress (its resolv.conf is
 * bound over the snapshot's); undefined for loopback only (bubblewrap's own namespace).
 */
async function setUpNetwork(ctx: StartContext, spec: SandboxSpec, mounts: BwrapMount[]): Promise<LaunchOptions["netns"]> {
  const { host } = ctx;
  if (!spec.network || spec.network === "none") return undefined;
  if (!ctx.tools.nsenter) throw errors.failedPrecondition("nsenter is not installed (util-linux): needed for sandboxes with network access");
  const lease = await host.networks.setUp(spec.id, { mode: spec.network, allowCidrs: spec.networkAllowList });
  await host.writeLease(spec.id, lease);
  const resolv = path.join(host.layout.runtime(spec.id), "resolv.conf");
  await writeFile(resolv, host.networks.resolvConf(), { mode: 0o644 });
  await ensureMountPoint(host.layout.rootMount(spec.id), "/etc/resolv.conf", false, {});
  mounts.push({ source: resolv, target: "/etc/resolv.conf", readonly: true });
  return { nsenter: ctx.tools.nsenter, path: `/run/netns/${lease.netns}` };
}
