import { mkdir, realpath, rm, stat } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import Docker from "dockerode";
import { ConnectError, errors } from "@sandbar/protocol";
import { type ChangeLayerOptions, type ChangeSource, type NetworkMode, PLATFORM_PATHS, platformUser, type SandboxInfo, type SandboxProvider, type SandboxResources, type SandboxSpec, type StartOptions, type StopOptions } from "../provider.ts";
import { definedOf, memoryBytesOf, validateId, validateSpec } from "../spec.ts";
import { accepts } from "../host/agent-socket.ts";
import { usageOfPid } from "../host/cgroup-usage.ts";
import { which } from "../host/command.ts";
import { checkRootAndInit, statOrFail } from "../host/host-paths.ts";
import { packLayer, restoreLayer } from "../host/layer.ts";
import { isMountpoint, mountsUnder, unmount } from "../host/mounts.ts";
import type { Layout } from "../host/layout.ts";
import type { NetworkPolicy } from "../host/network.ts";
import type { SandboxRecord } from "../host/record.ts";
import { baseInfo, errorOf, type HostOptions, SandboxHost } from "../host/sandbox-host.ts";
import { Containers } from "./containers.ts";
import { RootfsImages } from "./rootfs-image.ts";
import { prepareStart, userOf } from "./start-prep.ts";

// The Docker provider (DESIGN.md decision 7): the same sandboxes as the linux provider, as
// containers of a Docker engine. What is the same: the agent is the host's node and bundle,
// bound read-only, started by the same supervising init, listening on a unix socket in a host
// directory bound at /run/sandbar; each sandbox runs as its own unprivileged host uid with every
// capability dropped and no new privileges; egress goes through the same veth and nftables policy
// (network.ts), attached to the container's namespace; the writable layer packs and restores
// with the same tar format (a tar of overlayfs's upper directory). What differs: the engine makes
// the namespaces and cgroups (its default seccomp profile instead of ours, no user namespace: the
// sandbox uid is a host uid inside too), and a disk cap holds only where the engine's storage
// allows one (overlay2 on xfs with project quotas); elsewhere it is not enforced.
//
// State: a record per sandbox in the data dir (as the linux provider's) plus the container named
// `sandbar-<runner key>-<id>`; a new provider on the same data dir and engine picks both up.

export interface DockerProviderOptions extends HostOptions {
  /** The engine's API socket; default /var/run/docker.sock (or DOCKER_HOST). */
  socketPath?: string;
  /** OCI runtime of the containers: "runc" (default) or "runsc" (gVisor; the engine must know it). */
  runtime?: string;
}

export class DockerProvider implements SandboxProvider {
  readonly name = "docker";
  readonly host: SandboxHost;
  readonly containers: Containers;
  readonly #images: RootfsImages;
  readonly #initSh: string;
  readonly #nsenter?: string;

  private constructor(host: SandboxHost, containers: Containers, initSh: string) {
    this.host = host;
    this.containers = containers;
    this.#initSh = initSh;
    this.#nsenter = which("nsenter");
    this.#images = new RootfsImages(containers.docker, host.log);
  }

  get layout(): Layout {
    return this.host.layout;
  }

  get docker(): Docker {
    return this.containers.docker;
  }

  get runtime(): string {
    return this.containers.runtime;
  }

  /** Checks the engine answers (and knows the runtime asked for), and loads the sandboxes on disk. */
  static async open(options: DockerProviderOptions): Promise<DockerProvider> {
    if (process.getuid?.() !== 0) throw errors.failedPrecondition("the docker provider must run as root (it owns sandbox files and their network)");
    const docker = new Docker(options.socketPath ? { socketPath: options.socketPath } : undefined);
    let runtimes: Record<string, unknown>;
    try {
      runtimes = ((await docker.info()) as { Runtimes?: Record<string, unknown> }).Runtimes ?? {};
    } catch (err) {
      throw errors.failedPrecondition(`the Docker engine at ${options.socketPath ?? "the default socket"} does not answer: ${(err as Error).message}`);
    }
    const runtime = options.runtime ?? "runc";
    if (!(runtime in runtimes)) throw errors.failedPrecondition(`the Docker engine has no runtime ${runtime} (it has ${Object.keys(runtimes).join(", ")})`);
    if (runtime === "runsc") {
      // Without --host-uds the agent's socket stays inside gVisor and no start could ever finish.
      const args = ((runtimes.runsc as { runtimeArgs?: string[] }).runtimeArgs ?? []).join(" ");
      if (!/--host-uds[= ](all|create)/.test(args)) {
        throw errors.failedPrecondition('the engine\'s runsc runtime needs "runtimeArgs": ["--host-uds=all", "--network=none"] (daemon.json): the agent\'s socket must be reachable from the host');
      }
    }
    const initSh = await realpath(which("sh") ?? "/bin/sh");
    const host = await SandboxHost.open(options);
    return new DockerProvider(host, new Containers(docker, runtime, host.layout.key, host.log), initSh);
  }

  containerName(id: string): string {
    return this.containers.name(id);
  }

  // ---- create -------------------------------------------------------------------------------

  async create(input: SandboxSpec): Promise<SandboxInfo> {
    const spec = validateSpec(input);
    await checkHostPaths(spec);
    if (this.runtime === "runsc" && spec.network && spec.network !== "none") {
      throw errors.failedPrecondition(`network mode ${spec.network} is not available with the runsc runtime (gVisor keeps its own network stack): only "none"`);
    }
    const image = await this.#images.imageFor(spec.rootfs);
    const { host } = this;
    return host.lock.with(spec.id, async () => {
      await host.assertNew(spec.id);
      const hostUid = host.uids.allocate();
      const dir = host.layout.sandboxDir(spec.id);
      try {
        await mkdir(dir, { mode: 0o700 });
        // A container left by a crash between its creation and the record's: not ours any more.
        await this.containers.remove(spec.id);
        const bundleIsDir = (await stat(spec.init.bundle)).isDirectory();
        await this.containers.create(spec, image, userOf(spec, hostUid), { layout: host.layout, initSh: this.#initSh, volumeGid: host.volumeGid }, bundleIsDir);
        const rec = host.newRecord(spec, hostUid);
        await host.writeRecord(rec);
        return this.#info(rec);
      } catch (err) {
        await this.containers.remove(spec.id).catch(() => undefined);
        await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        host.uids.release(hostUid);
        if (err instanceof ConnectError) throw err;
        throw errors.failedPrecondition(`sandbox ${spec.id}: the engine refused its container: ${(err as Error).message}`);
      }
    });
  }

  // ---- start --------------------------------------------------------------------------------

  async start(id: string, options: StartOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const state = await this.containers.state(id);
      if (!state) throw errors.failedPrecondition(`sandbox ${id}: its container is gone from the engine (removed outside Sandbar); destroy it`);
      if (state.running) return this.#info(rec);
      await this.#teardown(id); // leftovers of a crash or of a first process that died
      try {
        await prepareStart(this.host, rec, state);
        await this.containers.start(id);
        const running = await this.containers.state(id);
        if (rec.spec.network && rec.spec.network !== "none" && running?.running) await this.#attachNetwork(rec.spec, running.pid);
        await this.#waitForAgent(id, options.timeoutMs ?? 30_000);
      } catch (err) {
        await this.containers.kill(id).catch(() => undefined);
        await this.#teardown(id).catch((e: unknown) => this.host.log(`sandbox ${id}: cleanup after failed start: ${String(e)}`));
        throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
      }
      await this.host.markStarted(rec);
      return this.#info(rec);
    });
  }

  async #attachNetwork(spec: SandboxSpec, pid: number, policy: NetworkPolicy = { mode: spec.network!, allowCidrs: spec.networkAllowList }): Promise<void> {
    if (!this.#nsenter) throw errors.failedPrecondition("nsenter is not installed (util-linux): needed for sandboxes with network access");
    await this.host.writeLease(spec.id, await this.host.networks.attach(pid, this.#nsenter, policy));
  }

  /** Until the agent's socket accepts; fails early when the container exits or the agent died once. */
  async #waitForAgent(id: string, timeoutMs: number): Promise<void> {
    const socket = this.host.layout.socket(id);
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; ; i++) {
      if ((await accepts(socket)) === "accepting") return;
      if (i % 10 === 0) {
        const s = await this.containers.state(id);
        if (!s?.running) throw new Error(`the sandbox's first process exited with ${s?.exitCode ?? "?"} before listening on its socket${await this.containers.logTail(id)}`);
        const died = await this.host.agentRestarts(id);
        if (died.count > 0) throw new Error(`the agent exited with ${died.lastStatus ?? "?"} before listening on its socket${await this.containers.logTail(id)}`);
      }
      if (Date.now() > deadline) throw new Error(`the sandbox's first process did not listen on ${socket} within ${timeoutMs} ms${await this.containers.logTail(id)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  /** Changes a sandbox's egress, at once when it runs (see SandboxHost.updateNetwork). Returns whether it took effect now. */
  async updateNetwork(id: string, network: NetworkMode, allowList: string[] = []): Promise<boolean> {
    validateId(id);
    if (this.runtime === "runsc" && validateSpec({ ...(await this.host.record(id)).spec, network, networkAllowList: allowList }).network !== "none") {
      throw errors.failedPrecondition(`network mode ${network} is not available with the runsc runtime: only "none"`);
    }
    let pid = 0;
    const running = async () => {
      const state = await this.containers.state(id);
      pid = state?.pid ?? 0;
      return state?.running === true;
    };
    return this.host.updateNetwork(id, network, allowList, running, (rec, policy) => this.#attachNetwork(rec.spec, pid, policy));
  }

  /** CPU and memory through the engine (live when running); the disk is fixed when the container is made. */
  async resize(id: string, resources: SandboxResources): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const spec = validateSpec({ ...rec.spec, ...definedOf(resources) });
      if (spec.diskGiB !== rec.spec.diskGiB) throw errors.failedPrecondition(`sandbox ${id}: the docker provider cannot change a sandbox's disk size`);
      if (spec.cpu !== rec.spec.cpu || spec.memoryGiB !== rec.spec.memoryGiB) {
        // Debian's runsc has no `update`: the engine's live change fails inside the runtime.
        if (this.runtime === "runsc" && (await this.containers.state(id))?.running) throw errors.failedPrecondition(`sandbox ${id}: the runsc runtime cannot change limits while it runs; stop it first`);
        await this.containers.update(id, spec.cpu, memoryBytesOf(spec));
      }
      rec.spec = { ...rec.spec, cpu: spec.cpu, memoryGiB: spec.memoryGiB };
      await this.host.writeRecord(rec);
      return this.#info(rec);
    });
  }

  // ---- pause / resume -----------------------------------------------------------------------

  /** `docker pause`: the engine's freezer; memory is not reclaimed (the engine offers no way to). */
  async pause(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const state = await this.containers.state(id);
      if (!state?.running) throw errors.failedPrecondition(`sandbox ${id} is not started`);
      if (!state.paused) await this.containers.pause(id);
      return this.#info(rec);
    });
  }

  async resume(id: string): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      if ((await this.containers.state(id))?.paused) await this.containers.unpause(id);
      return this.#info(rec);
    });
  }

  // ---- stop / destroy -----------------------------------------------------------------------

  async stop(id: string, options: StopOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      if ((await this.containers.state(id))?.paused) await this.containers.unpause(id); // its processes must see the SIGTERM
      if (options.force) await this.containers.kill(id);
      else await this.containers.stop(id, options.graceMs ?? 5000);
      await this.#teardown(id);
      await this.host.markStopped(rec);
      return this.#info(rec);
    });
  }

  /** Removes what a start made on the host: the network lease, volume binds, the runtime dir. Idempotent. */
  async #teardown(id: string): Promise<void> {
    const L = this.host.layout;
    await this.host.networks.tearDown(await this.host.readLease(id), id);
    for (const m of (await mountsUnder(path.join(L.runtime(id), "volumes"))).reverse()) await unmount(m);
    const left = await mountsUnder(L.runtime(id));
    if (left.length > 0) throw errors.internal(`sandbox ${id}: still mounted after stop: ${left.join(", ")}`);
    await rm(L.runtime(id), { recursive: true, force: true });
  }

  async destroy(id: string): Promise<void> {
    validateId(id);
    await this.host.lock.with(id, async () => {
      const rec = await this.host.record(id).catch(() => undefined);
      await this.containers.remove(id);
      await this.#teardown(id);
      await rm(this.host.layout.sandboxDir(id), { recursive: true, force: true });
      if (rec) this.host.uids.release(rec.hostUid);
    });
  }

  /** Destroys the sandboxes nothing claims (the engine's leftovers are their containers, removed with them). */
  async removeLeftovers(unclaimed: readonly string[] = []): Promise<string[]> {
    const removed: string[] = [];
    for (const id of unclaimed) {
      await this.destroy(id).then(
        () => removed.push(id),
        (err: unknown) => this.host.log(`leftovers: removing sandbox ${id} failed: ${err instanceof Error ? err.message : String(err)}`),
      );
    }
    return removed;
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
    await this.host.record(id);
    if (!(await this.containers.state(id))?.running) throw errors.failedPrecondition(`sandbox ${id} is not started`);
    return this.host.layout.socket(id);
  }

  async #info(rec: SandboxRecord): Promise<SandboxInfo> {
    const id = rec.spec.id;
    const state = await this.containers.state(id);
    const running = state?.running === true;
    const info = baseInfo(rec, running);
    const restarts = await this.host.agentRestarts(id);
    if (running) {
      const usage = await usageOfPid(state.pid);
      if (usage) info.usage = usage;
      info.agent = { running: await this.containers.agentRunning(id, this.host.layout.socket(id)), restarts: restarts.count };
      if (restarts.at) info.agent.lastRestartAt = restarts.at;
      if (state.paused) {
        info.state = "paused";
        info.paused = { residentBytes: usage?.memoryBytes ?? 0, method: "none" };
      }
    }
    if (!state) {
      info.state = "error";
      info.error = "its container is gone from the engine (removed outside Sandbar); destroy it";
    } else if (info.state === "error") {
      info.error = errorOf(`exited with code ${state.exitCode ?? "?"}`, state.oomKilled ? ["the sandbox ran out of memory"] : [], restarts);
    }
    return info;
  }

  // ---- writable layer -----------------------------------------------------------------------

  async pack(id: string): Promise<Readable> {
    validateId(id);
    const release = await this.host.lock.acquire(id);
    try {
      const rec = await this.host.record(id);
      const state = await this.containers.state(id);
      if (!state?.upperDir) throw errors.failedPrecondition(`sandbox ${id}: its container's writable layer is not on this host`);
      // The lock is held until tar is done with the layer.
      const handle = await packLayer(state.upperDir, rec.hostUid, path.join(this.host.layout.sandboxDir(id), "owner-map"), async () => release());
      return handle.stream;
    } catch (err) {
      release();
      throw err;
    }
  }

  /** The container's upper over its image's layers, as the engine's overlay2 driver reports them. */
  async changeLayers(id: string, options: ChangeLayerOptions = {}): Promise<ChangeSource> {
    validateId(id);
    if (options.since?.length) throw errors.invalidArgument("since: checkpoints are not available on this runner (docker provider: no captured layers)");
    if (options.consistent) throw errors.invalidArgument("consistent: a frozen read is not available on this runner (docker provider)");
    const rec = await this.host.record(id);
    const state = await this.containers.state(id);
    if (!state?.upperDir) throw errors.invalidArgument(`sandbox ${id}: the engine's storage driver shows no upper directory (overlay2 is required for changes)`);
    const exclude = [...PLATFORM_PATHS, ...(rec.spec.mounts ?? []).map((m) => m.target), ...(rec.spec.volumes ?? []).map((v) => v.target)];
    return { layers: { upper: state.upperDir, lowers: state.lowerDirs ?? [], exclude, platformUser: platformUser(rec.spec.user) }, release: async () => undefined };
  }

  async restore(id: string, archive: Readable): Promise<void> {
    archive.on("error", () => undefined); // see LinuxProvider.restore
    validateId(id);
    await this.host.lock.with(id, async () => {
      const rec = await this.host.record(id);
      const state = await this.containers.state(id);
      if (state?.running) throw errors.failedPrecondition(`sandbox ${id} is running; stop it before restoring its writable layer`);
      if (!state?.upperDir || !state.workDir) throw errors.failedPrecondition(`sandbox ${id}: its container's writable layer is not on this host`);
      // Not mounted while the container is stopped (overlay2 mounts at start): the layer is plain files.
      const merged = path.join(path.dirname(state.upperDir), "merged");
      if (await isMountpoint(merged)) throw errors.failedPrecondition(`sandbox ${id}: its writable layer is in use by the engine`);
      try {
        await restoreLayer(state.upperDir, state.workDir, archive, rec.hostUid);
      } catch (err) {
        throw errors.failedPrecondition(`sandbox ${id}: ${(err as Error).message}`);
      }
    });
  }

  /** Sandboxes keep running; the engine's connections are per request. */
  async close(): Promise<void> {
    await this.host.removeRuntimeDirIfEmpty();
  }
}

async function checkHostPaths(spec: SandboxSpec): Promise<void> {
  await checkRootAndInit(spec);
  for (const m of spec.mounts ?? []) await statOrFail("mount source", m.source);
  // The engine parses binds as source:target:mode.
  for (const p of [spec.init.node, spec.init.bundle, ...(spec.mounts ?? []).flatMap((m) => [m.source, m.target]), ...(spec.volumes ?? []).map((v) => v.target)]) {
    if (p.includes(":") || p.includes(",")) throw errors.invalidArgument(`path ${p} cannot be bound by the Docker engine (it contains ':' or ',')`);
  }
}

