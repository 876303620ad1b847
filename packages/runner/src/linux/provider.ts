import { access, chmod, chown, mkdir, readdir, readFile, readlink, realpath, rm, rmdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { ConnectError, errors } from "@sandbar/protocol";
import type { NetworkMode, SandboxInfo, SandboxProvider, SandboxResources, SandboxSpec, StartOptions, StopOptions } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { definedOf, diskBytesOf, memoryBytesOf, validateId, validateSpec } from "../spec.ts";
import { bwrapOptions, type BwrapMount } from "./bwrap.ts";
import { detectCgroups } from "./cgroups/detect.ts";
import type { CgroupBackend, UserLimits } from "./cgroups/types.ts";
import { which } from "./command.ts";
import { syscallFilter } from "./syscall-filter.ts";
import { SharedToolsLayers } from "./tools-layer.ts";
import { assertReachable, statOrFail } from "./host-paths.ts";
import { KeyedLock } from "./keyed-lock.ts";
import { packLayer, restoreLayer } from "./layer.ts";
import { INIT_SCRIPT, initArgs } from "./init-script.ts";
import type { AgentRestarts, LaunchOptions } from "./launcher.ts";
import type { NetworkLease, NetworkOptions } from "./network.ts";
import { SandboxNetworks } from "./network.ts";
import { AGENT_OOM_SCORE_ADJ, launch, readRestarts, waitForSocket, type LaunchedProcess } from "./launcher.ts";
import { Layout } from "./layout.ts";
import { bindVolume, prepareVolumeRoot } from "./volume-binds.ts";
import { growDiskImage, isMountpoint, mountDiskImage, mountPoints, mountRoot, mountsUnder, unmount } from "./mounts.ts";
import type { SandboxRecord } from "./record.ts";
import { listRecordIds, readAllRecords, readRecord, writeRecord } from "./record.ts";
import { ensureMountPoint, ensureUser, sandboxUser } from "./rootprep.ts";
import { sandboxAgent, sandboxInit } from "./sandbox-procs.ts";
import { endSandboxProcesses } from "./terminate.ts";
import { UidAllocator } from "./uids.ts";
import { settleAll } from "./settle.ts";
import { DiskImagePool, type DiskPoolOptions } from "./disk-pool.ts";
import { startSpawner } from "./spawner.ts";
import { MeminfoRefresher } from "./meminfo-refresher.ts";
import { type LeftoverTally, removeLeftovers } from "./leftovers.ts";

// The linux provider (DESIGN.md decision 6): an overlayfs root over the snapshot, a loop-mounted
// ext4 upper layer when a disk cap is set, cgroup limits joined before exec, and bubblewrap run
// as a dedicated host uid for the namespaces. No daemon: the state is the data dir plus the kernel.

export interface LinuxProviderOptions {
  /** Root of the runner's persistent state (sandboxes/, snapshots/). */
  dataDir: string;
  /** Where mount points and agent sockets live; default /run/sandbar/<hash of dataDir>. */
  runtimeDir?: string;
  /** Host uid range for sandboxes; default 1 500 000 000 + 65 536. */
  uidBase?: number;
  uidCount?: number;
  /** Group of volume directories, given to sandboxes that mount volumes; default the range's last uid (then never a sandbox's). */
  volumeGid?: number;
  /** Force a cgroup back end (default: what the host offers). */
  cgroupVersion?: "v1" | "v2";
  log?: (line: string) => void;
  /** Time spent in each phase of a start (ms), for benchmarks and tracing. */
  trace?: (id: string, phase: StartPhase, ms: number) => void;
  /** Egress of sandboxes whose network mode is not "none" (subnet, nftables table, resolvers). */
  network?: NetworkOptions;
  /** Disk images formatted ahead of need (disk-pool.ts); `{ perSize: 0 }` formats one per create. */
  diskPool?: Partial<Omit<DiskPoolOptions, "log">>;
  /** How often running sandboxes' /proc/meminfo views are refreshed (ms); default 1000. */
  meminfoRefreshMs?: number;
}

export type StartPhase = "cleanup" | "dirs" | "overlay" | "root-prep" | "cgroup" | "network" | "spawn" | "socket";

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/sandbar/bin";
const CPU_PERIOD_US = 100_000;

interface Tools {
  bwrap: string;
  setpriv: string;
  /** Host path of the shell used as the sandbox's pid 1. */
  initSh: string;
  /** The compiled seccomp program every sandbox process runs under. */
  seccompFile: string;
  nsenter?: string;
}

/** Pids and memory the user leaf leaves to the agent (bounded to a share of small sandboxes). */
const AGENT_PIDS_RESERVE = 64;
const AGENT_MEMORY_RESERVE = 64 * 2 ** 20;

/** The user leaf's budget: the totals minus the agent's reserve. */
export function userLimitsOf(memoryBytes: number, pidsLimit: number): UserLimits {
  const pidsReserve = Math.min(AGENT_PIDS_RESERVE, Math.floor(pidsLimit / 2));
  const memoryReserve = Math.min(AGENT_MEMORY_RESERVE, Math.floor(memoryBytes / 4));
  return { pidsMax: Math.max(1, pidsLimit - pidsReserve), memoryBytes: memoryBytes - memoryReserve };
}

export class LinuxProvider implements SandboxProvider {
  readonly name = "linux";
  readonly layout: Layout;
  readonly cgroups: CgroupBackend;
  readonly #tools: Tools;
  /** Tools layers (node, init shell, agent bundle) shared by the sandboxes that run the same ones. */
  readonly #toolsLayers: SharedToolsLayers;
  readonly #uids: UidAllocator;
  readonly #networks: SandboxNetworks;
  readonly #diskPool: DiskImagePool;
  /** Keeps each running sandbox's /proc/meminfo view (its memory, not the host's) current. */
  readonly meminfo: MeminfoRefresher;
  readonly #lock = new KeyedLock();
  readonly #exits = new Map<string, { code: number | null; signal: string | null }>();
  readonly #log: (line: string) => void;
  /** Told how long each phase of a start took (benchmarks profile with it). */
  trace: NonNullable<LinuxProviderOptions["trace"]>;
  #oomWarned = false;

  readonly #volumeGid: number;

  private constructor(layout: Layout, cgroups: CgroupBackend, tools: Tools, uids: UidAllocator, networks: SandboxNetworks, diskPool: DiskImagePool, meminfo: MeminfoRefresher, options: LinuxProviderOptions) {
    this.layout = layout;
    this.meminfo = meminfo;
    this.#diskPool = diskPool;
    this.#networks = networks;
    this.cgroups = cgroups;
    this.#tools = tools;
    this.#toolsLayers = new SharedToolsLayers(path.join(layout.dataDir, "tools-layers"), () => this.#toolsLayersLinked());
    this.#uids = uids;
    this.#volumeGid = options.volumeGid!;
    this.#log = options.log ?? (() => undefined);
    this.trace = options.trace ?? (() => undefined);
  }

  /** The tools layers some sandbox's overlay links to (its `layers/l0`, made by mountRoot). */
  async #toolsLayersLinked(): Promise<Set<string>> {
    const linked = new Set<string>();
    for (const id of await listRecordIds(this.layout)) {
      const target = await readlink(path.join(this.layout.sandboxDir(id), "layers", "l0")).catch(() => undefined);
      if (target) linked.add(path.resolve(target));
    }
    return linked;
  }

  /** A stopwatch reporting each phase of a start to the trace hook. */
  #phases(id: string): (phase: StartPhase) => void {
    let last = performance.now();
    return (phase) => {
      const now = performance.now();
      this.trace(id, phase, now - last);
      last = now;
    };
  }

  /** Checks the host (root, bwrap, setpriv, cgroups) and loads the sandboxes already on disk. */
  static async open(options: LinuxProviderOptions): Promise<LinuxProvider> {
    if (process.getuid?.() !== 0) throw errors.failedPrecondition("the linux provider must run as root (it mounts and manages cgroups)");
    const bwrap = which("bwrap");
    if (!bwrap) throw errors.failedPrecondition("bubblewrap is not installed: apt-get install bubblewrap");
    const setpriv = which("setpriv");
    if (!setpriv) throw errors.failedPrecondition("setpriv is not installed: apt-get install util-linux");
    const initSh = await realpath(which("sh") ?? "/bin/sh");
    const seccompFile = await syscallFilter(options.dataDir);
    const layout = new Layout(options.dataDir, options.runtimeDir);
    const cgroups = await detectCgroups({ group: `sandbar-${layout.key}`, version: options.cgroupVersion });
    await mkdir(layout.sandboxesDir, { recursive: true, mode: 0o700 });
    const uids = new UidAllocator(options.uidBase, options.uidCount);
    const volumeGid = options.volumeGid ?? uids.base + uids.count - 1;
    if (volumeGid >= uids.base && volumeGid < uids.base + uids.count) uids.markUsed(volumeGid);
    const networks = await SandboxNetworks.create({ netnsPrefix: `sandbar-${layout.key}-`, ...options.network });
    startSpawner(); // ready long before a first start needs it
    const diskPool = await DiskImagePool.open(path.join(layout.dataDir, "disk-pool"), { ...options.diskPool, log: options.log });
    const meminfo = await MeminfoRefresher.open({ cgroups, intervalMs: options.meminfoRefreshMs, log: options.log });
    const provider = new LinuxProvider(layout, cgroups, { bwrap, setpriv, initSh, seccompFile, nsenter: which("nsenter") }, uids, networks, diskPool, meminfo, { ...options, volumeGid });
    for (const id of await listRecordIds(layout)) {
      const rec = await readRecord(layout, id).catch(() => undefined);
      if (rec) uids.markUsed(rec.hostUid);
      const lease = await readLease(layout, id);
      if (lease) networks.markUsed(lease);
    }
    // What a runner killed (or a data dir deleted) left: gone before anything new is made.
    await provider.removeLeftovers().catch((err: unknown) => provider.#log(`leftovers: ${err instanceof Error ? err.message : String(err)}`));
    await provider.#adoptMeminfoViews();
    return provider;
  }

  /** Running sandboxes of an earlier runner get their /proc/meminfo views refreshed again. */
  async #adoptMeminfoViews(): Promise<void> {
    for (const id of await listRecordIds(this.layout)) {
      await this.#lock.with(id, async () => {
        if ((await this.cgroups.pids(id)).length > 0) this.meminfo.adopt(id, meminfoFile(this.layout, id));
      }).catch((err: unknown) => this.#log(`sandbox ${id}: /proc/meminfo view: ${err instanceof Error ? err.message : String(err)}`));
    }
  }

  // ---- create -------------------------------------------------------------------------------

  async create(input: SandboxSpec): Promise<SandboxInfo> {
    const spec = validateSpec(input);
    await this.#checkHostPaths(spec);
    return this.#lock.with(spec.id, async () => {
      if (await readRecord(this.layout, spec.id)) throw errors.alreadyExists(`sandbox ${spec.id} already exists`);
      const dir = this.layout.sandboxDir(spec.id);
      const hostUid = this.#uids.allocate();
      try {
        await mkdir(dir, { mode: 0o700 });
        const disk = diskBytesOf(spec);
        if (disk !== undefined) {
          await this.#diskPool.claim(this.layout.diskImage(spec.id), disk);
        } else {
          await mkdir(this.layout.upper(spec.id, false), { mode: 0o755 });
          await mkdir(this.layout.work(spec.id, false), { mode: 0o700 });
        }
        const rec: SandboxRecord = { version: 1, spec, hostUid, createdAt: new Date().toISOString(), desired: "created" };
        await writeRecord(this.layout, rec);
        return this.#info(rec);
      } catch (err) {
        await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        this.#uids.release(hostUid);
        throw err;
      }
    });
  }

  async #checkHostPaths(spec: SandboxSpec): Promise<void> {
    if (!(await statOrFail("rootfs", spec.rootfs)).isDirectory()) throw errors.failedPrecondition(`rootfs ${spec.rootfs} is not a directory`);
    const node = await statOrFail("init.node", spec.init.node);
    if (!node.isFile()) throw errors.failedPrecondition(`init.node ${spec.init.node} is not a file`);
    // node and the bundle become a lower layer of the root (tools-layer.ts), read with the
    // runner's credentials: unlike bind sources they need not be reachable by the sandbox uid.
    const bundle = await statOrFail("init.bundle", spec.init.bundle);
    if (bundle.isDirectory()) {
      if (!spec.init.main) throw errors.invalidArgument(`init.main is required: init.bundle ${spec.init.bundle} is a directory`);
      await statOrFail("init.main", path.join(spec.init.bundle, spec.init.main));
    }
    for (const m of spec.mounts ?? []) {
      await statOrFail("mount source", m.source);
      await assertReachable("mount source", m.source);
    }
  }

  // ---- start --------------------------------------------------------------------------------

  async start(id: string, options: StartOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const phase = this.#phases(id);
      const [rec, pids] = await Promise.all([this.#record(id), this.cgroups.pids(id)]);
      if (pids.length > 0) return this.#info(rec);
      await this.#teardown(id, 0, true); // leftovers of a crash or of a first process that died
      phase("cleanup");
      const child = await this.#prepareAndLaunch(rec, phase);
      try {
        const restartsFile = path.join(this.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts));
        await waitForSocket(this.layout.socket(id), child, options.timeoutMs ?? 30_000, this.layout.initLog(id), restartsFile);
        phase("socket");
        // The init and the agent are never the OOM killer's choice (launch set their score before
        // they existed; a restarted agent inherits it from the init); only the host can lower it.
        if (child.oomScoreDenied && !this.#oomWarned) {
          this.#oomWarned = true;
          this.#log("this host's root lacks CAP_SYS_RESOURCE: agents keep oom_score_adj 0 (user processes run at +1000)");
        }
      } catch (err) {
        await this.#teardown(id).catch((e: unknown) => this.#log(`sandbox ${id}: cleanup after failed start: ${String(e)}`));
        throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
      }
      rec.desired = "started";
      rec.startedAt = new Date().toISOString();
      const [, info] = await Promise.all([writeRecord(this.layout, rec), this.#info(rec)]);
      return info;
    });
  }

  async #prepareAndLaunch(rec: SandboxRecord, phase: (p: StartPhase) => void): Promise<LaunchedProcess> {
    const { spec, hostUid } = rec;
    const id = spec.id;
    const L = this.layout;
    const hasDisk = spec.diskGiB !== undefined;
    const owner = { uid: hostUid, gid: hostUid };
    // The cgroup and the tools layer need nothing of the mounts: made while the mounts are.
    const limits = this.#applyLimits(spec, hostUid);
    limits.catch(() => undefined); // awaited below; a failure before then must not go unhandled
    try {
      const tools = this.#toolsLayers.layer({ initSh: this.#tools.initSh, node: spec.init.node, bundle: spec.init.bundle, main: spec.init.main });
      tools.catch(() => undefined);
      await settleAll([
        (async () => {
          // Runtime dirs: traversable by the sandbox uid, writable only by root (the run dir by the sandbox).
          await mkdir(L.runtimeDir, { recursive: true, mode: 0o711 });
          await chmod(L.runtimeDir, 0o711);
          await mkdir(L.runtime(id), { recursive: true, mode: 0o711 });
          await settleAll([mkdir(L.rootMount(id), { recursive: true }), mkdir(L.runDir(id), { recursive: true, mode: 0o700 }).then(() => chown(L.runDir(id), hostUid, hostUid))]);
          await rm(L.socket(id), { force: true });
        })(),
        hasDisk ? mkdir(L.diskMount(id), { recursive: true, mode: 0o700 }) : Promise.resolve(),
      ]);
      phase("dirs");
      const { dir: toolsDir, agentEntry } = await tools;
      // The disk image (its upper and work dirs made on it) and the overlay, in one process.
      const overlay = { lowers: [toolsDir, spec.rootfs], upper: L.upper(id, hasDisk), work: L.work(id, hasDisk), target: L.rootMount(id), linkDir: path.join(L.sandboxDir(id), "layers") };
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
          await prepareVolumeRoot(v.root, this.#volumeGid);
          await bindVolume(v, at, this.#volumeGid);
        });
        addMount(at, v.target, false, volumes);
      }
      addMount(L.runDir(id), SANDBOX_PATHS.runDir, false);
      // The user leaf's procs files (one per v1 hierarchy), writable by the sandbox uid only: the
      // agent moves what it starts for the user there. Created below, bound once they exist.
      const userProcs = this.cgroups.userProcsFiles(id).map((source, i) => ({ source, target: path.join(SANDBOX_PATHS.userCgroupDir, String(i)) }));
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
      this.meminfo.create(id, meminfoFile(L, id));
      mounts.push({ source: meminfoFile(L, id), target: "/proc/meminfo", readonly: true });

      phase("cgroup");
      // `nproc` (and OpenMP, OpenBLAS) honour OMP_NUM_THREADS: the CPU quota rather than the host's CPUs.
      const env = { PATH: DEFAULT_PATH, HOME: user.home, USER: user.name, OMP_NUM_THREADS: String(Math.max(1, Math.ceil(spec.cpu))), ...spec.env };
      // /dev/shm is memory charged to the user leaf that no OOM kill gives back: half its budget.
      const shmBytes = Math.floor(userLimits.memoryBytes / 2);
      const netns = await this.#setUpNetwork(spec, mounts);
      phase("network");
      const options = bwrapOptions({ root, hostname: id, uid: user.uid, gid: user.gid, env, cwd: spec.workdir ?? user.home, mounts, shmBytes, shareNet: netns !== undefined });
      this.#exits.delete(id);
      const child = await launch({
        bwrap: this.#tools.bwrap, setpriv: this.#tools.setpriv, hostUid, hostGid: hostUid, procsFiles: this.cgroups.procsFiles(id), bwrapOptions: options, command,
        logFile: L.initLog(id), seccompFile: this.#tools.seccompFile, netns, oomScoreAdj: AGENT_OOM_SCORE_ADJ, ...(spec.volumes?.length ? { groups: [this.#volumeGid], umask: 0o002 } : {}),
      });
      child.on("exit", (code, signal) => this.#exits.set(id, { code, signal }));
      phase("spawn");
      return child;
    } catch (err) {
      await limits.catch(() => undefined); // settled before the teardown removes what it made
      await this.#teardown(id).catch(() => undefined);
      if (err instanceof ConnectError) throw err;
      throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
    }
  }

  /**
   * The sandbox's network namespace, veth pair and policy when it has egress (its resolv.conf is
   * bound over the snapshot's); undefined for loopback only (bubblewrap's own namespace).
   */
  async #setUpNetwork(spec: SandboxSpec, mounts: BwrapMount[]): Promise<LaunchOptions["netns"]> {
    if (!spec.network || spec.network === "none") return undefined;
    if (!this.#tools.nsenter) throw errors.failedPrecondition("nsenter is not installed (util-linux): needed for sandboxes with network access");
    const lease = await this.#networks.setUp(spec.id, { mode: spec.network, allowCidrs: spec.networkAllowList });
    await writeFile(leaseFile(this.layout, spec.id), JSON.stringify(lease), { mode: 0o600 });
    const resolv = path.join(this.layout.runtime(spec.id), "resolv.conf");
    await writeFile(resolv, this.#networks.resolvConf(), { mode: 0o644 });
    await ensureMountPoint(this.layout.rootMount(spec.id), "/etc/resolv.conf", false, {});
    mounts.push({ source: resolv, target: "/etc/resolv.conf", readonly: true });
    return { nsenter: this.#tools.nsenter, path: `/run/netns/${lease.netns}` };
  }

  /**
   * Changes a sandbox's network policy, at once when it runs: its nft chain is replaced in one
   * transaction; one started loopback-only gets a veth into its namespace (its resolv.conf stays the
   * snapshot's until its next start). Returns whether it took effect now (false: stopped).
   */
  async updateNetwork(id: string, network: NetworkMode, allowList: string[] = []): Promise<boolean> {
    validateId(id);
    const checked = validateSpec({ ...(await this.#record(id)).spec, network, networkAllowList: allowList });
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      rec.spec.network = checked.network;
      rec.spec.networkAllowList = checked.networkAllowList;
      await writeRecord(this.layout, rec);
      if ((await this.cgroups.pids(id)).length === 0) return false;
      const policy = { mode: checked.network ?? "none", allowCidrs: checked.networkAllowList };
      const lease = await readLease(this.layout, id);
      if (lease) {
        await this.#networks.applyPolicy(lease, policy);
        return true;
      }
      if (policy.mode === "none") return true; // loopback only already
      const init = await sandboxInit(this.cgroups, id);
      if (init === undefined || !this.#tools.nsenter) throw errors.failedPrecondition(`sandbox ${id}: cannot reach its network namespace to add egress; restart it`);
      const attached = await this.#networks.attach(init, this.#tools.nsenter, policy);
      await writeFile(leaseFile(this.layout, id), JSON.stringify(attached), { mode: 0o600 });
      return true;
    });
  }

  /** Creates the sandbox's cgroup, or resets the limits of the one it runs in, from its spec. */
  async #applyLimits(spec: SandboxSpec, hostUid: number): Promise<UserLimits> {
    const memoryBytes = memoryBytesOf(spec);
    const userLimits = userLimitsOf(memoryBytes, spec.pidsLimit);
    await this.cgroups.create(spec.id, { memoryBytes, pidsMax: spec.pidsLimit, cpuPeriodUs: CPU_PERIOD_US, cpuQuotaUs: Math.max(1000, Math.round(spec.cpu * CPU_PERIOD_US)) }, userLimits, hostUid);
    return userLimits;
  }

  // ---- resize -------------------------------------------------------------------------------

  async resize(id: string, resources: SandboxResources): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      const spec = validateSpec({ ...rec.spec, ...definedOf(resources) });
      const running = (await this.cgroups.pids(id)).length > 0;
      const growDisk = spec.diskGiB !== rec.spec.diskGiB;
      if (growDisk) {
        if (running) throw errors.failedPrecondition(`sandbox ${id} is running: its disk can only grow while it is stopped`);
        if (rec.spec.diskGiB === undefined) throw errors.failedPrecondition(`sandbox ${id} has no disk cap to grow`);
        if (spec.diskGiB! < rec.spec.diskGiB) throw errors.invalidArgument(`sandbox ${id}: the disk cannot shrink (${rec.spec.diskGiB} to ${spec.diskGiB} GiB)`);
        if (await isMountpoint(this.layout.diskMount(id))) throw errors.failedPrecondition(`sandbox ${id}: its disk is in use (being packed?)`);
        await growDiskImage(this.layout.diskImage(id), diskBytesOf(spec)!);
      }
      // A running sandbox's cgroup takes the new cpu and memory at once (the kernel refuses a
      // memory limit below what the sandbox uses); a stopped one gets them at its next start.
      if (running && (spec.cpu !== rec.spec.cpu || spec.memoryGiB !== rec.spec.memoryGiB)) await this.#applyLimits(spec, rec.hostUid);
      rec.spec = { ...rec.spec, cpu: spec.cpu, memoryGiB: spec.memoryGiB, ...(spec.diskGiB !== undefined ? { diskGiB: spec.diskGiB } : {}) };
      await writeRecord(this.layout, rec);
      return this.#info(rec);
    });
  }

  // ---- stop / destroy -----------------------------------------------------------------------

  async stop(id: string, options: StopOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      await this.#teardown(id, options.force ? 0 : (options.graceMs ?? 5000));
      if (rec.desired === "started") {
        rec.desired = "stopped";
        await writeRecord(this.layout, rec);
      }
      return this.#info(rec);
    });
  }

  /**
   * Kills the sandbox's processes, removes its cgroup, mounts and runtime dir. Idempotent.
   * `idle`: the caller just saw the cgroup empty (a start), so there is nothing to kill.
   * `tally`: counts what was there (leftovers; a few more reads, so only for them).
   */
  async #teardown(id: string, graceMs = 0, idle = false, tally?: LeftoverTally): Promise<void> {
    const L = this.layout;
    if (tally) {
      if (!idle) tally.add("processes", (await this.cgroups.pids(id)).length);
      if ((await Promise.all(this.cgroups.paths(id).map(exists))).some(Boolean)) tally.add("cgroups");
    }
    if (!idle) await endSandboxProcesses(this.cgroups, id, graceMs);
    this.meminfo.untrack(id);
    await this.cgroups.remove(id);
    // One read of the mount table; read again only to check what was unmounted is gone.
    const table = await mountPoints();
    const runtimeMounts = table.filter((m) => m === L.runtime(id) || m.startsWith(L.runtime(id) + "/"));
    const volumesDir = path.join(L.runtime(id), "volumes") + "/";
    const unmountCounted = async (target: string) => {
      await unmount(target);
      tally?.add("mounts");
    };
    if (runtimeMounts.includes(L.rootMount(id))) await unmountCounted(L.rootMount(id));
    if (table.includes(L.diskMount(id))) await unmountCounted(L.diskMount(id));
    for (const m of runtimeMounts.filter((x) => x.startsWith(volumesDir)).reverse()) await unmountCounted(m);
    if (tally) await this.#networks.removeLeftover(await readLease(L, id), id, (kind) => tally.add(kind));
    else await this.#networks.tearDown(await readLease(L, id), id);
    const left = runtimeMounts.length > 0 ? await mountsUnder(L.runtime(id)) : [];
    if (left.length > 0) throw errors.internal(`sandbox ${id}: still mounted after stop: ${left.join(", ")}`);
    await rm(L.runtime(id), { recursive: true, force: true });
  }

  async destroy(id: string): Promise<void> {
    validateId(id);
    await this.#lock.with(id, () => this.#removeWhole(id));
  }

  /** destroy's work, under the sandbox's lock: everything it has on the host, its files too. */
  async #removeWhole(id: string, tally?: LeftoverTally): Promise<void> {
    const rec = await readRecord(this.layout, id).catch(() => undefined);
    await this.#teardown(id, 0, false, tally);
    const dir = this.layout.sandboxDir(id);
    const left = await mountsUnder(dir);
    if (left.length > 0) throw errors.internal(`sandbox ${id}: cannot remove, still mounted: ${left.join(", ")}`);
    await rm(dir, { recursive: true, force: true });
    if (rec) this.#uids.release(rec.hostUid);
    this.#exits.delete(id);
  }

  /**
   * Removes what earlier runs left on the host for this data dir (leftovers.ts): the sandboxes
   * `unclaimed` names, whole, the remains of sandboxes with no record, what a sandbox that is not
   * running still holds, and loop devices of the data dir no mount uses; logs one line per kind.
   * Returns the ids removed whole.
   */
  removeLeftovers(unclaimed: readonly string[] = []): Promise<string[]> {
    return removeLeftovers(
      {
        layout: this.layout,
        cgroups: this.cgroups,
        networks: this.#networks,
        log: this.#log,
        locked: (id, fn) => this.#lock.with(id, fn),
        removeWhole: (id, tally) => this.#removeWhole(id, tally),
        tearDownIdle: (id, tally) => this.#teardown(id, 0, true, tally),
      },
      unclaimed,
    );
  }

  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    validateId(id);
    await this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      rec.spec = { ...rec.spec, env: { ...env } };
      await writeRecord(this.layout, rec);
    });
  }

  // ---- inspect / list / connect -------------------------------------------------------------

  async inspect(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.#info(await this.#record(id));
  }

  async list(): Promise<SandboxInfo[]> {
    const out: SandboxInfo[] = [];
    for (const rec of await readAllRecords(this.layout, this.#log)) out.push(await this.#info(rec));
    return out;
  }

  async connect(id: string): Promise<string> {
    validateId(id);
    const rec = await this.#record(id);
    if ((await this.cgroups.pids(id)).length === 0) throw errors.failedPrecondition(`sandbox ${id} is not started`);
    return this.layout.socket(rec.spec.id);
  }

  async #record(id: string): Promise<SandboxRecord> {
    const rec = await readRecord(this.layout, id);
    if (!rec) throw errors.notFound(`sandbox ${id} not found`);
    return rec;
  }

  async #info(rec: SandboxRecord): Promise<SandboxInfo> {
    const id = rec.spec.id;
    // Independent reads, at once: a start answers with this right after its agent listens.
    const [pids, stats, restarts] = await Promise.all([this.cgroups.pids(id), this.cgroups.stats(id), this.#agentRestarts(id)]);
    const running = pids.length > 0;
    const { secret: _secret, ...init } = rec.spec.init;
    const info: SandboxInfo = {
      id,
      state: running ? "started" : rec.desired === "started" ? "error" : rec.desired,
      createdAt: new Date(rec.createdAt),
      hostUid: rec.hostUid,
      spec: { ...rec.spec, init },
    };
    if (rec.startedAt && running) info.startedAt = new Date(rec.startedAt);
    if (running && stats) info.usage = stats;
    if (running) {
      // No connection to it: a probe would load the agent's HTTP/2 stack in every idle sandbox.
      info.agent = { running: (await sandboxAgent(this.cgroups, id, SANDBOX_PATHS.node)) !== undefined, restarts: restarts.count };
      if (restarts.at) info.agent.lastRestartAt = restarts.at;
    }
    if (info.state === "error") {
      const exit = this.#exits.get(id);
      const how = exit ? (exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`) : "is gone";
      const seen: string[] = [];
      if (stats && stats.oomKills > 0) seen.push(`the sandbox ran out of memory: ${stats.oomKills} OOM kill(s)`);
      if (stats && stats.pidsLimitHits > 0) seen.push(`${stats.pidsLimitHits} fork(s) refused at the pids limit`);
      if (restarts.count > 0) seen.push(`its agent had been restarted ${restarts.count} time(s), last after exiting with ${restarts.lastStatus ?? "?"}`);
      info.error = `the sandbox's first process ${how}${seen.length > 0 ? ` (${seen.join("; ")})` : ""}; start it again to recover it with its files`;
    }
    return info;
  }

  async #agentRestarts(id: string): Promise<AgentRestarts> {
    return readRestarts(path.join(this.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts)));
  }

  // ---- writable layer -----------------------------------------------------------------------

  async pack(id: string): Promise<Readable> {
    validateId(id);
    const release = await this.#lock.acquire(id);
    let mountedHere = false;
    const L = this.layout;
    try {
      const rec = await this.#record(id);
      const hasDisk = rec.spec.diskGiB !== undefined;
      if (hasDisk && !(await isMountpoint(L.diskMount(id)))) {
        await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
        await mountDiskImage(L.diskImage(id), L.diskMount(id), true);
        mountedHere = true;
      }
      // The lock (and a temporary mount) are held until tar is done with the layer.
      const cleanup = async () => {
        if (mountedHere) await unmount(L.diskMount(id)).catch((e: unknown) => this.#log(`sandbox ${id}: unmount after pack: ${String(e)}`));
        release();
      };
      const handle = await packLayer(L.upper(id, hasDisk), rec.hostUid, path.join(L.sandboxDir(id), "owner-map"), cleanup);
      return handle.stream;
    } catch (err) {
      if (mountedHere) await unmount(L.diskMount(id)).catch(() => undefined);
      release();
      throw err;
    }
  }

  async restore(id: string, archive: Readable): Promise<void> {
    // Listen at once: a source that fails while we wait for the lock must not go unhandled
    // (restoreLayer reads `archive.errored`).
    archive.on("error", () => undefined);
    validateId(id);
    await this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      if ((await this.cgroups.pids(id)).length > 0) throw errors.failedPrecondition(`sandbox ${id} is running; stop it before restoring its writable layer`);
      await this.#teardown(id);
      const L = this.layout;
      const hasDisk = rec.spec.diskGiB !== undefined;
      if (hasDisk) {
        await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
        await mountDiskImage(L.diskImage(id), L.diskMount(id));
      }
      try {
        await restoreLayer(L.upper(id, hasDisk), L.work(id, hasDisk), archive, rec.hostUid);
      } catch (err) {
        throw errors.failedPrecondition(`sandbox ${id}: ${(err as Error).message}`);
      } finally {
        if (hasDisk) await unmount(L.diskMount(id));
      }
    });
  }

  // ---- shutdown -----------------------------------------------------------------------------

  async close(): Promise<void> {
    this.meminfo.close();
    await this.#diskPool.close();
    await this.cgroups.removeParentIfEmpty();
    try {
      if ((await readdir(this.layout.runtimeDir)).length === 0) await rmdir(this.layout.runtimeDir);
    } catch {
      // missing or in use
    }
  }
}

const exists = (p: string) => access(p).then(() => true, () => false);

/** The sandbox's /proc/meminfo view (meminfo-refresher.ts); it goes with the runtime dir. */
function meminfoFile(layout: Layout, id: string): string {
  return path.join(layout.runtime(id), "meminfo");
}

function leaseFile(layout: Layout, id: string): string {
  return path.join(layout.runtime(id), "network.json");
}

/** The network a sandbox got at its last start, if it still has one (kept in its runtime dir). */
async function readLease(layout: Layout, id: string): Promise<NetworkLease | undefined> {
  try {
    return JSON.parse(await readFile(leaseFile(layout, id), "utf8")) as NetworkLease;
  } catch {
    return undefined;
  }
}
