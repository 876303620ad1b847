import { mkdir, readlink, realpath, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { errors } from "@sandbar/protocol";
import type { ChangeLayerOptions, ChangeSource, NetworkMode, SandboxInfo, SandboxProvider, SandboxResources, SandboxSpec, StartOptions, StopOptions } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { startSpawner } from "../host/spawner.ts";
import { definedOf, diskBytesOf, validateId, validateSpec } from "../spec.ts";
import { which } from "../host/command.ts";
import { assertReachable, checkRootAndInit, statOrFail } from "../host/host-paths.ts";
import { Layout } from "../host/layout.ts";
import { isMountpoint, mountsUnder, unmount } from "../host/mounts.ts";
import { listRecordIds, type SandboxRecord } from "../host/record.ts";
import { baseInfo, errorOf, type HostOptions, SandboxHost } from "../host/sandbox-host.ts";
import { detectCgroups } from "./cgroups/detect.ts";
import type { CgroupBackend, Reclaimed } from "./cgroups/types.ts";
import { DiskImagePool, type DiskPoolOptions } from "./disk-pool.ts";
import { copyLayer, LayerStore, squashInto } from "./layers.ts";
import { waitForSocket } from "./launcher.ts";
import { type LeftoverTally, removeLeftovers } from "./leftovers.ts";
import { MeminfoRefresher } from "./meminfo-refresher.ts";
import { growDiskImage, mountDiskImage } from "./mounts.ts";
import { sandboxAgent, sandboxInit } from "./sandbox-procs.ts";
import { applyLimits, meminfoFile, prepareAndLaunch, type StartContext, type StartPhase, type Tools } from "./sandbox-start.ts";
import { syscallFilter } from "./syscall-filter.ts";
import { tearDown } from "./teardown.ts";
import { SharedToolsLayers } from "./tools-layer.ts";
import { packSandbox, restoreSandbox, sandboxChangeLayers } from "./writable-layer.ts";

// The linux provider (DESIGN.md decision 6): an overlayfs root over the snapshot, a loop-mounted
// ext4 upper layer when a disk cap is set, cgroup limits joined before exec, and bubblewrap run
// as a dedicated host uid for the namespaces. No daemon: the state is the data dir plus the kernel.

export type { StartPhase } from "./sandbox-start.ts";

export interface LinuxProviderOptions extends HostOptions {
  /** Force a cgroup back end (default: what the host offers). */
  cgroupVersion?: "v1" | "v2";
  /** Time spent in each phase of a start (ms), for benchmarks and tracing. */
  trace?: (id: string, phase: StartPhase, ms: number) => void;
  /** Disk images formatted ahead of need (disk-pool.ts); `{ perSize: 0 }` formats one per create. */
  diskPool?: Partial<Omit<DiskPoolOptions, "log">>;
  /** How often running sandboxes' /proc/meminfo views are refreshed (ms); default 1000. */
  meminfoRefreshMs?: number;
}

export class LinuxProvider implements SandboxProvider {
  readonly name = "linux";
  readonly host: SandboxHost;
  readonly cgroups: CgroupBackend;
  readonly #tools: Tools;
  /** Tools layers (node, init shell, agent bundle) shared by the sandboxes that run the same ones. */
  readonly #toolsLayers: SharedToolsLayers;
  readonly #diskPool: DiskImagePool;
  /** Captured layers (layers.ts): forks and snapshots of running sandboxes stack them. */
  readonly layers: LayerStore;
  /** Keeps each running sandbox's /proc/meminfo view (its memory, not the host's) current. */
  readonly meminfo: MeminfoRefresher;
  readonly #exits = new Map<string, { code: number | null; signal: string | null }>();
  /** What each pause of this process reclaimed (a paused sandbox re-adopted after a restart has none). */
  readonly #reclaimed = new Map<string, Reclaimed>();
  /** Told how long each phase of a start took (benchmarks profile with it). */
  trace: NonNullable<LinuxProviderOptions["trace"]>;
  #oomWarned = false;

  private constructor(host: SandboxHost, cgroups: CgroupBackend, tools: Tools, diskPool: DiskImagePool, meminfo: MeminfoRefresher, layers: LayerStore, options: LinuxProviderOptions) {
    this.host = host;
    this.layers = layers;
    this.meminfo = meminfo;
    this.#diskPool = diskPool;
    this.cgroups = cgroups;
    this.#tools = tools;
    this.#toolsLayers = new SharedToolsLayers(path.join(host.layout.dataDir, "tools-layers"), () => this.#toolsLayersLinked());
    this.trace = options.trace ?? (() => undefined);
  }

  get layout(): Layout {
    return this.host.layout;
  }

  get #startContext(): StartContext {
    return {
      host: this.host,
      cgroups: this.cgroups,
      tools: this.#tools,
      toolsLayers: this.#toolsLayers,
      meminfo: this.meminfo,
      layerRoot: (l) => this.layers.root(l),
      onExit: (id, exit) => (exit ? this.#exits.set(id, exit) : this.#exits.delete(id)),
      teardown: (id) => this.#teardown(id),
    };
  }

  /** The tools layers some sandbox's overlay links to (its `layers/l0`, made by mountRoot). */
  async #toolsLayersLinked(): Promise<Set<string>> {
    const linked = new Set<string>();
    for (const id of await listRecordIds(this.host.layout)) {
      const target = await readlink(path.join(this.host.layout.sandboxDir(id), "layers", "l0")).catch(() => undefined);
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
    const cgroups = await detectCgroups({ group: `sandbar-${new Layout(options.dataDir, options.runtimeDir).key}`, version: options.cgroupVersion });
    const host = await SandboxHost.open(options);
    startSpawner(); // ready long before a first start needs it
    const diskPool = await DiskImagePool.open(path.join(host.layout.dataDir, "disk-pool"), { ...options.diskPool, log: options.log });
    const meminfo = await MeminfoRefresher.open({ cgroups, intervalMs: options.meminfoRefreshMs, log: options.log });
    const layers = await LayerStore.open(path.join(host.layout.dataDir, "layers"));
    // A layer holds its uid as a sandbox does: forks and sandboxes made on it run as that uid.
    for (const l of await layers.list()) host.uids.markUsed(await layers.uid(l.id));
    const provider = new LinuxProvider(host, cgroups, { bwrap, setpriv, initSh, seccompFile, nsenter: which("nsenter") }, diskPool, meminfo, layers, options);
    await provider.#thawInterruptedCaptures();
    // What a runner killed (or a data dir deleted) left: gone before anything new is made.
    await provider.removeLeftovers().catch((err: unknown) => host.log(`leftovers: ${err instanceof Error ? err.message : String(err)}`));
    await provider.#adoptMeminfoViews();
    return provider;
  }

  /** Running sandboxes of an earlier runner get their /proc/meminfo views refreshed again. */
  async #adoptMeminfoViews(): Promise<void> {
    for (const id of await listRecordIds(this.host.layout)) {
      await this.host.lock.with(id, async () => {
        if ((await this.cgroups.pids(id)).length > 0) this.meminfo.adopt(id, meminfoFile(this.host.layout, id));
      }).catch((err: unknown) => this.host.log(`sandbox ${id}: /proc/meminfo view: ${err instanceof Error ? err.message : String(err)}`));
    }
  }

  // ---- create -------------------------------------------------------------------------------

  async create(input: SandboxSpec): Promise<SandboxInfo> {
    const spec = validateSpec(input);
    await this.#checkHostPaths(spec);
    return this.host.lock.with(spec.id, async () => {
      await this.host.assertNew(spec.id);
      const dir = this.host.layout.sandboxDir(spec.id);
      // On captured layers: their author's uid, which owns their files (layers.ts).
      const hostUid = spec.layers?.length ? await this.layers.uid(spec.layers[0]!) : this.host.uids.allocate();
      if (spec.layers?.length) this.host.uids.markUsed(hostUid);
      try {
        await mkdir(dir, { mode: 0o700 });
        const disk = diskBytesOf(spec);
        if (disk !== undefined) {
          await this.#diskPool.claim(this.host.layout.diskImage(spec.id), disk);
        } else {
          await mkdir(this.host.layout.upper(spec.id, false), { mode: 0o755 });
          await mkdir(this.host.layout.work(spec.id, false), { mode: 0o700 });
        }
        const rec = this.host.newRecord(spec, hostUid);
        await this.host.writeRecord(rec);
        return this.#info(rec);
      } catch (err) {
        await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        this.host.uids.release(hostUid);
        throw err;
      }
    });
  }

  async #checkHostPaths(spec: SandboxSpec): Promise<void> {
    // node and the bundle become a lower layer of the root (tools-layer.ts), read with the
    // runner's credentials: unlike bind sources they need not be reachable by the sandbox uid.
    await checkRootAndInit(spec);
    for (const m of spec.mounts ?? []) {
      await statOrFail("mount source", m.source);
      await assertReachable("mount source", m.source);
    }
  }

  // ---- start --------------------------------------------------------------------------------

  async start(id: string, options: StartOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const phase = this.#phases(id);
      const [rec, pids] = await Promise.all([this.host.record(id), this.cgroups.pids(id)]);
      if (pids.length > 0) return this.#info(rec);
      await this.#teardown(id, 0, true); // leftovers of a crash or of a first process that died
      phase("cleanup");
      const child = await prepareAndLaunch(this.#startContext, rec, phase);
      try {
        const restartsFile = path.join(this.host.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts));
        await waitForSocket(this.host.layout.socket(id), child, options.timeoutMs ?? 30_000, this.host.layout.initLog(id), restartsFile);
        phase("socket");
        // The init and the agent are never the OOM killer's choice (launch set their score before
        // they existed; a restarted agent inherits it from the init); only the host can lower it.
        if (child.oomScoreDenied && !this.#oomWarned) {
          this.#oomWarned = true;
          this.host.log("this host's root lacks CAP_SYS_RESOURCE: agents keep oom_score_adj 0 (user processes run at +1000)");
        }
      } catch (err) {
        await this.#teardown(id).catch((e: unknown) => this.host.log(`sandbox ${id}: cleanup after failed start: ${String(e)}`));
        throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
      }
      const [, info] = await Promise.all([this.host.markStarted(rec), this.#info(rec)]);
      return info;
    });
  }

  /**
   * Changes a sandbox's network policy, at once when it runs (SandboxHost.updateNetwork): one
   * started loopback-only gets a veth into its namespace (its resolv.conf stays the snapshot's
   * until its next start). Returns whether it took effect now (false: stopped).
   */
  async updateNetwork(id: string, network: NetworkMode, allowList: string[] = []): Promise<boolean> {
    const running = async () => (await this.cgroups.pids(id)).length > 0;
    return this.host.updateNetwork(id, network, allowList, running, async (_rec, policy) => {
      const init = await sandboxInit(this.cgroups, id);
      if (init === undefined || !this.#tools.nsenter) throw errors.failedPrecondition(`sandbox ${id}: cannot reach its network namespace to add egress; restart it`);
      await this.host.writeLease(id, await this.host.networks.attach(init, this.#tools.nsenter, policy));
    });
  }

  // ---- resize -------------------------------------------------------------------------------

  async resize(id: string, resources: SandboxResources): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const spec = validateSpec({ ...rec.spec, ...definedOf(resources) });
      const running = (await this.cgroups.pids(id)).length > 0;
      const growDisk = spec.diskGiB !== rec.spec.diskGiB;
      if (growDisk) {
        if (running) throw errors.failedPrecondition(`sandbox ${id} is running: its disk can only grow while it is stopped`);
        if (rec.spec.diskGiB === undefined) throw errors.failedPrecondition(`sandbox ${id} has no disk cap to grow`);
        if (spec.diskGiB! < rec.spec.diskGiB) throw errors.invalidArgument(`sandbox ${id}: the disk cannot shrink (${rec.spec.diskGiB} to ${spec.diskGiB} GiB)`);
        if (await isMountpoint(this.host.layout.diskMount(id))) throw errors.failedPrecondition(`sandbox ${id}: its disk is in use (being packed?)`);
        await growDiskImage(this.host.layout.diskImage(id), diskBytesOf(spec)!);
      }
      // A running sandbox's cgroup takes the new cpu and memory at once (the kernel refuses a
      // memory limit below what the sandbox uses); a stopped one gets them at its next start.
      if (running && (spec.cpu !== rec.spec.cpu || spec.memoryGiB !== rec.spec.memoryGiB)) await applyLimits(this.cgroups, spec, rec.hostUid);
      rec.spec = { ...rec.spec, cpu: spec.cpu, memoryGiB: spec.memoryGiB, ...(spec.diskGiB !== undefined ? { diskGiB: spec.diskGiB } : {}) };
      await this.host.writeRecord(rec);
      return this.#info(rec);
    });
  }

  // ---- pause / resume -----------------------------------------------------------------------

  /**
   * Freezes the whole sandbox group (agent and user leaves) and reclaims its memory. Nothing of
   * it is written down: the kernel's freezer state is the record, so a restarted provider finds
   * the sandbox paused and leaves it so.
   */
  async pause(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      if ((await this.cgroups.pids(id)).length === 0) throw errors.failedPrecondition(`sandbox ${id} is not started`);
      if (!(await this.cgroups.frozen(id))) {
        await this.cgroups.freeze(id);
        this.#reclaimed.set(id, await this.cgroups.reclaim(id));
      }
      return this.#info(rec);
    });
  }

  async resume(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      await this.cgroups.thaw(id);
      this.#reclaimed.delete(id);
      return this.#info(rec);
    });
  }

  // ---- stop / destroy -----------------------------------------------------------------------

  async stop(id: string, options: StopOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      await this.#teardown(id, options.force ? 0 : (options.graceMs ?? 5000));
      this.#reclaimed.delete(id);
      await this.host.markStopped(rec);
      return this.#info(rec);
    });
  }

  /** Kills the sandbox's processes and removes what its start made (linux/teardown.ts). */
  #teardown(id: string, graceMs = 0, idle = false, tally?: LeftoverTally): Promise<void> {
    return tearDown(this, id, graceMs, idle, tally);
  }

  async destroy(id: string): Promise<void> {
    validateId(id);
    await this.host.lock.with(id, () => this.#removeWhole(id));
  }

  /** destroy's work, under the sandbox's lock: everything it has on the host, its files too. */
  async #removeWhole(id: string, tally?: LeftoverTally): Promise<void> {
    const rec = await this.host.record(id).catch(() => undefined);
    await this.#teardown(id, 0, false, tally);
    const dir = this.host.layout.sandboxDir(id);
    const left = await mountsUnder(dir);
    if (left.length > 0) throw errors.internal(`sandbox ${id}: cannot remove, still mounted: ${left.join(", ")}`);
    await rm(dir, { recursive: true, force: true });
    if (rec) this.host.uids.release(rec.hostUid);
    this.#exits.delete(id);
    this.#reclaimed.delete(id);
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
        layout: this.host.layout,
        cgroups: this.cgroups,
        networks: this.host.networks,
        log: this.host.log,
        locked: (id, fn) => this.host.lock.with(id, fn),
        removeWhole: (id, tally) => this.#removeWhole(id, tally),
        tearDownIdle: (id, tally) => this.#teardown(id, 0, true, tally),
      },
      unclaimed,
    );
  }

  setEnv(id: string, env: Record<string, string>): Promise<void> {
    return this.host.setEnv(id, env);
  }

  // ---- inspect / list / connect -------------------------------------------------------------

  async inspect(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.#info(await this.host.record(id));
  }

  async list(): Promise<SandboxInfo[]> {
    const out: SandboxInfo[] = [];
    for (const rec of await this.host.records()) out.push(await this.#info(rec));
    return out;
  }

  async connect(id: string): Promise<string> {
    validateId(id);
    const rec = await this.host.record(id);
    if ((await this.cgroups.pids(id)).length === 0) throw errors.failedPrecondition(`sandbox ${id} is not started`);
    return this.host.layout.socket(rec.spec.id);
  }

  async #info(rec: SandboxRecord): Promise<SandboxInfo> {
    const id = rec.spec.id;
    // Independent reads, at once: a start answers with this right after its agent listens.
    const [pids, stats, restarts, frozen] = await Promise.all([this.cgroups.pids(id), this.cgroups.stats(id), this.host.agentRestarts(id), this.cgroups.frozen(id)]);
    const running = pids.length > 0;
    const info = baseInfo(rec, running);
    if (running && stats) info.usage = stats;
    if (running && frozen) {
      const r = this.#reclaimed.get(id);
      info.state = "paused";
      info.paused = { residentBytes: stats?.memoryBytes ?? 0, ...(r ? { reclaimedBytes: Math.max(0, r.beforeBytes - r.afterBytes), method: r.method } : {}) };
    }
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
      info.error = errorOf(how, seen, restarts);
    }
    return info;
  }

  // ---- captured layers ----------------------------------------------------------------------

  /** Marks a capture under way: a runner killed while the sandbox is frozen thaws it at its next open. */
  #captureMarker(id: string): string {
    return path.join(this.host.layout.sandboxDir(id), "capturing");
  }

  async #thawInterruptedCaptures(): Promise<void> {
    for (const id of await listRecordIds(this.host.layout)) {
      const marker = this.#captureMarker(id);
      if (!(await rm(marker).then(() => true, () => false))) continue;
      await this.cgroups.thaw(id).catch((err: unknown) => this.host.log(`sandbox ${id}: thaw after an interrupted capture: ${String(err)}`));
      this.host.log(`sandbox ${id}: thawed after an interrupted capture`);
    }
  }

  async captureLayer(id: string, layerId: string): Promise<void> {
    validateId(id);
    validateId(layerId);
    await this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const L = this.host.layout;
      const hasDisk = rec.spec.diskGiB !== undefined;
      const running = (await this.cgroups.pids(id)).length > 0;
      // A stopped sandbox's disk image is mounted read-only for the copy (as a pack does).
      const mountHere = hasDisk && !(await isMountpoint(L.diskMount(id)));
      if (mountHere) {
        await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
        await mountDiskImage(L.diskImage(id), L.diskMount(id), true);
      }
      try {
        // A sandbox frozen already (paused) stays so: nothing to freeze, nothing to thaw after.
        const freeze = running && !(await this.cgroups.frozen(id));
        await this.layers.make(layerId, rec.hostUid, async (root) => {
          if (!freeze) return copyLayer(L.upper(id, hasDisk), root, [SANDBOX_PATHS.agentState]);
          await writeFile(this.#captureMarker(id), layerId, { mode: 0o600 });
          await this.cgroups.freeze(id);
          try {
            await copyLayer(L.upper(id, hasDisk), root, [SANDBOX_PATHS.agentState]);
          } finally {
            await this.cgroups.thaw(id);
            await rm(this.#captureMarker(id), { force: true });
          }
        });
        this.host.uids.markUsed(rec.hostUid); // the layer holds its author's uid
      } finally {
        if (mountHere) await unmount(L.diskMount(id)).catch((e: unknown) => this.host.log(`sandbox ${id}: unmount after capture: ${String(e)}`));
      }
    });
  }

  async squashLayers(layerIds: string[], layerId: string): Promise<void> {
    validateId(layerId);
    if (layerIds.length === 0) throw errors.invalidArgument("no layers to squash");
    const uid = await this.layers.uid(layerIds[0]!);
    await this.layers.make(layerId, uid, (root) => squashInto(layerIds.map((l) => this.layers.root(validateId(l))), root));
    this.host.uids.markUsed(uid);
  }

  async removeLayers(layerIds: string[]): Promise<void> {
    for (const l of layerIds) {
      const uid = await this.layers.uid(validateId(l)).catch(() => undefined);
      if (uid === undefined) continue;
      await this.layers.remove(l);
      this.host.uids.release(uid);
    }
  }

  listLayers(): Promise<Array<{ id: string; createdAt: Date }>> {
    return this.layers.list();
  }

  async layerSource(layerId: string): Promise<{ root: string; uid: number }> {
    const uid = await this.layers.uid(validateId(layerId)); // FAILED_PRECONDITION when absent
    return { root: this.layers.root(layerId), uid };
  }

  /** A captured layer's root, which must be on this host (a changeset's checkpoint names it). */
  async #layerHere(layerId: string): Promise<string> {
    const root = this.layers.root(validateId(layerId));
    await stat(root).catch(() => Promise.reject(errors.failedPrecondition(`layer ${layerId} is not on this host`)));
    return root;
  }

  // ---- writable layer -----------------------------------------------------------------------

  async pack(id: string): Promise<Readable> {
    validateId(id);
    return packSandbox(this.host, id);
  }

  async changeLayers(id: string, options: ChangeLayerOptions = {}): Promise<ChangeSource> {
    validateId(id);
    return sandboxChangeLayers(this.host, this.cgroups, id, { consistent: options.consistent ?? false, since: options.since, layerRoot: (l) => this.#layerHere(l) });
  }

  async restore(id: string, archive: Readable): Promise<void> {
    // Listen at once: a source that fails while we wait for the lock must not go unhandled
    // (restoreLayer reads `archive.errored`).
    archive.on("error", () => undefined);
    validateId(id);
    await this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      if ((await this.cgroups.pids(id)).length > 0) throw errors.failedPrecondition(`sandbox ${id} is running; stop it before restoring its writable layer`);
      await this.#teardown(id);
      await restoreSandbox(this.host, rec, archive);
    });
  }

  // ---- shutdown -----------------------------------------------------------------------------

  async close(): Promise<void> {
    this.meminfo.close();
    await this.#diskPool.close();
    await this.cgroups.removeParentIfEmpty();
    await this.host.removeRuntimeDirIfEmpty();
  }
}

