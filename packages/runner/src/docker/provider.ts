import { chmod, chown, mkdir, readdir, readFile, realpath, rm, rmdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import Docker from "dockerode";
import { ConnectError, errors } from "@sandbar/protocol";
import type { NetworkMode, SandboxInfo, SandboxProvider, SandboxResources, SandboxSpec, StartOptions, StopOptions } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { definedOf, diskBytesOf, memoryBytesOf, validateId, validateSpec } from "../spec.ts";
import { which } from "../linux/command.ts";
import { statOrFail } from "../linux/host-paths.ts";
import { INIT_SCRIPT, initArgs } from "../linux/init-script.ts";
import { KeyedLock } from "../linux/keyed-lock.ts";
import { accepts, readRestarts } from "../linux/launcher.ts";
import { packLayer, restoreLayer } from "../linux/layer.ts";
import { Layout } from "../linux/layout.ts";
import { isMountpoint, mountsUnder, unmount } from "../linux/mounts.ts";
import type { NetworkLease, NetworkOptions } from "../linux/network.ts";
import { SandboxNetworks } from "../linux/network.ts";
import type { SandboxRecord } from "../linux/record.ts";
import { listRecordIds, readAllRecords, readRecord, writeRecord } from "../linux/record.ts";
import { UidAllocator } from "../linux/uids.ts";
import { bindVolume, prepareVolumeRoot } from "../linux/volume-binds.ts";
import { usageOfPid } from "./cgroup-stats.ts";
import { RootfsImages } from "./rootfs-image.ts";
import { envFile, prepareUser, type SandboxUser } from "./user-prep.ts";

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

export interface DockerProviderOptions {
  /** Root of the runner's persistent state (sandboxes/). */
  dataDir: string;
  /** Where agent sockets and runtime files live; default /run/sandbar/<hash of dataDir>. */
  runtimeDir?: string;
  /** The engine's API socket; default /var/run/docker.sock (or DOCKER_HOST). */
  socketPath?: string;
  /** OCI runtime of the containers: "runc" (default) or "runsc" (gVisor; the engine must know it). */
  runtime?: string;
  /** Host uid range for sandboxes; default 1 500 000 000 + 65 536. */
  uidBase?: number;
  uidCount?: number;
  /** Group of volume directories, given to sandboxes that mount volumes; default the range's last uid. */
  volumeGid?: number;
  network?: NetworkOptions;
  log?: (line: string) => void;
}

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/sandbar/bin";
const ENV_FILE = "/run/sandbar/env";
const LABEL_RUNNER = "sandbar.runner";
const LABEL_ID = "sandbar.sandbox";

interface ContainerState {
  running: boolean;
  pid: number;
  startedAt?: string;
  exitCode?: number;
  oomKilled?: boolean;
  upperDir?: string;
  workDir?: string;
}

export class DockerProvider implements SandboxProvider {
  readonly name = "docker";
  readonly layout: Layout;
  readonly docker: Docker;
  readonly runtime: string;
  readonly #images: RootfsImages;
  readonly #uids: UidAllocator;
  readonly #volumeGid: number;
  readonly #networks: SandboxNetworks;
  readonly #initSh: string;
  readonly #nsenter?: string;
  readonly #lock = new KeyedLock();
  readonly #log: (line: string) => void;
  /** Whether the engine can cap a container's writable layer; unknown until the first capped create. */
  #diskCaps: boolean | undefined;

  private constructor(docker: Docker, layout: Layout, uids: UidAllocator, networks: SandboxNetworks, initSh: string, options: DockerProviderOptions) {
    this.docker = docker;
    this.layout = layout;
    this.runtime = options.runtime ?? "runc";
    this.#uids = uids;
    this.#volumeGid = options.volumeGid!;
    this.#networks = networks;
    this.#initSh = initSh;
    this.#nsenter = which("nsenter");
    this.#log = options.log ?? (() => undefined);
    this.#images = new RootfsImages(docker, this.#log);
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
    const layout = new Layout(options.dataDir, options.runtimeDir);
    await mkdir(layout.sandboxesDir, { recursive: true, mode: 0o700 });
    const uids = new UidAllocator(options.uidBase, options.uidCount);
    const volumeGid = options.volumeGid ?? uids.base + uids.count - 1;
    if (volumeGid >= uids.base && volumeGid < uids.base + uids.count) uids.markUsed(volumeGid);
    const networks = await SandboxNetworks.create({ netnsPrefix: `sandbar-${layout.key}-`, ...options.network });
    for (const id of await listRecordIds(layout)) {
      const rec = await readRecord(layout, id).catch(() => undefined);
      if (rec) uids.markUsed(rec.hostUid);
      const lease = await readLease(layout, id);
      if (lease) networks.markUsed(lease);
    }
    return new DockerProvider(docker, layout, uids, networks, initSh, { ...options, volumeGid });
  }

  containerName(id: string): string {
    return `sandbar-${this.layout.key}-${id}`;
  }

  // ---- create -------------------------------------------------------------------------------

  async create(input: SandboxSpec): Promise<SandboxInfo> {
    const spec = validateSpec(input);
    await checkHostPaths(spec);
    if (this.runtime === "runsc" && spec.network && spec.network !== "none") {
      throw errors.failedPrecondition(`network mode ${spec.network} is not available with the runsc runtime (gVisor keeps its own network stack): only "none"`);
    }
    const image = await this.#images.imageFor(spec.rootfs);
    return this.#lock.with(spec.id, async () => {
      if (await readRecord(this.layout, spec.id)) throw errors.alreadyExists(`sandbox ${spec.id} already exists`);
      const hostUid = this.#uids.allocate();
      const dir = this.layout.sandboxDir(spec.id);
      try {
        await mkdir(dir, { mode: 0o700 });
        // A container left by a crash between its creation and the record's: not ours any more.
        await this.#removeContainer(spec.id);
        await this.#createContainer(spec, image, hostUid);
        const rec: SandboxRecord = { version: 1, spec, hostUid, createdAt: new Date().toISOString(), desired: "created" };
        await writeRecord(this.layout, rec);
        return this.#info(rec);
      } catch (err) {
        await this.#removeContainer(spec.id).catch(() => undefined);
        await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        this.#uids.release(hostUid);
        if (err instanceof ConnectError) throw err;
        throw errors.failedPrecondition(`sandbox ${spec.id}: the engine refused its container: ${(err as Error).message}`);
      }
    });
  }

  #user(spec: SandboxSpec, hostUid: number): SandboxUser {
    const isRoot = spec.user === "root";
    // No user namespace: the sandbox's uid is its host uid inside too (root stays uid 0, without capabilities).
    return isRoot ? { name: "root", uid: 0, gid: 0, home: "/root" } : { name: spec.user!, uid: hostUid, gid: hostUid, home: `/home/${spec.user}` };
  }

  async #createContainer(spec: SandboxSpec, image: string, hostUid: number): Promise<void> {
    const id = spec.id;
    const L = this.layout;
    const user = this.#user(spec, hostUid);
    const bundleIsDir = (await stat(spec.init.bundle)).isDirectory();
    const agentEntry = bundleIsDir ? path.join(SANDBOX_PATHS.agent, spec.init.main!) : path.join(SANDBOX_PATHS.agent, path.basename(spec.init.bundle));
    const binds = [
      `${this.#initSh}:${SANDBOX_PATHS.init}:ro`,
      `${spec.init.node}:${SANDBOX_PATHS.node}:ro`,
      bundleIsDir ? `${spec.init.bundle}:${SANDBOX_PATHS.agent}:ro` : `${spec.init.bundle}:${agentEntry}:ro`,
      `${L.runDir(id)}:${SANDBOX_PATHS.runDir}:rw`,
      `${path.join(L.runtime(id), "resolv.conf")}:/etc/resolv.conf:ro`,
      ...(spec.mounts ?? []).map((m) => `${m.source}:${m.target}:${m.readonly === false ? "rw" : "ro"}`),
      ...(spec.volumes ?? []).map((v, i) => `${path.join(L.runtime(id), "volumes", String(i))}:${v.target}:rw`),
    ];
    const hasVolumes = (spec.volumes?.length ?? 0) > 0;
    // The env file is sourced before the init so setEnv applies at the next start without a new container.
    const init = `set -a; . ${ENV_FILE}; set +a; ${hasVolumes ? "umask 002; " : ""}${INIT_SCRIPT}`;
    const cmd = [SANDBOX_PATHS.init, "-c", init, ...initArgs(SANDBOX_PATHS.agentRestarts), SANDBOX_PATHS.node, ...(spec.init.nodeArgs ?? []), agentEntry, "--socket", SANDBOX_PATHS.agentSocket, "--state-dir", SANDBOX_PATHS.agentState];
    if (spec.init.secret !== undefined) cmd.push("--secret-file", SANDBOX_PATHS.secretFile);
    cmd.push(...(spec.init.args ?? []));
    const memory = memoryBytesOf(spec);
    const disk = diskBytesOf(spec);
    const options: Docker.ContainerCreateOptions = {
      name: this.containerName(id),
      Image: image,
      Entrypoint: [cmd[0]!],
      Cmd: cmd.slice(1),
      User: `${user.uid}:${user.gid}`,
      WorkingDir: spec.workdir ?? user.home,
      Hostname: id,
      Env: [],
      Labels: { [LABEL_RUNNER]: this.layout.key, [LABEL_ID]: id },
      NetworkDisabled: false,
      HostConfig: {
        Binds: binds,
        NetworkMode: "none",
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges"],
        IpcMode: "private",
        NanoCpus: Math.max(10_000_000, Math.round(spec.cpu * 1e9)),
        Memory: memory,
        MemorySwap: memory, // no swap on top
        PidsLimit: spec.pidsLimit,
        // /dev/shm is memory charged to the sandbox: half of it at most, as the linux provider.
        ShmSize: Math.floor(memory / 2),
        GroupAdd: hasVolumes ? [String(this.#volumeGid)] : [],
        Runtime: this.runtime,
        RestartPolicy: { Name: "no" },
        LogConfig: { Type: "json-file", Config: { "max-size": "1m", "max-file": "1" } },
        ...(disk !== undefined && this.#diskCaps !== false ? { StorageOpt: { size: String(disk) } } : {}),
      },
    };
    try {
      await this.docker.createContainer(options);
      if (options.HostConfig!.StorageOpt) this.#diskCaps = true;
    } catch (err) {
      // Most engines cannot cap a container's writable layer (overlay2 needs xfs with pquota): said once, then not asked again.
      if (!options.HostConfig!.StorageOpt || !/storage-opt|StorageOpt|quota/i.test((err as Error).message)) throw err;
      this.#diskCaps = false;
      this.#log(`docker: the engine cannot cap a container's disk (${(err as Error).message.trim()}): disk caps are not enforced`);
      delete options.HostConfig!.StorageOpt;
      await this.docker.createContainer(options);
    }
  }

  // ---- start --------------------------------------------------------------------------------

  async start(id: string, options: StartOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      const state = await this.#state(id);
      if (!state) throw errors.failedPrecondition(`sandbox ${id}: its container is gone from the engine (removed outside Sandbar); destroy it`);
      if (state.running) return this.#info(rec);
      await this.#teardown(id); // leftovers of a crash or of a first process that died
      try {
        await this.#prepare(rec, state);
        await this.docker.getContainer(this.containerName(id)).start();
        const running = await this.#state(id);
        if (rec.spec.network && rec.spec.network !== "none" && running?.running) await this.#attachNetwork(rec.spec, running.pid);
        await this.#waitForAgent(id, options.timeoutMs ?? 30_000);
      } catch (err) {
        await this.#kill(id).catch(() => undefined);
        await this.#teardown(id).catch((e: unknown) => this.#log(`sandbox ${id}: cleanup after failed start: ${String(e)}`));
        throw errors.failedPrecondition(`sandbox ${id} failed to start: ${(err as Error).message}`);
      }
      rec.desired = "started";
      rec.startedAt = new Date().toISOString();
      await writeRecord(this.layout, rec);
      return this.#info(rec);
    });
  }

  /** The host side of a start: runtime dir, env and secret files, resolv.conf, volume binds, the user in the layer. */
  async #prepare(rec: SandboxRecord, state: ContainerState): Promise<void> {
    const { spec, hostUid } = rec;
    const id = spec.id;
    const L = this.layout;
    const user = this.#user(spec, hostUid);
    await mkdir(L.runtimeDir, { recursive: true, mode: 0o711 });
    await chmod(L.runtimeDir, 0o711);
    await mkdir(L.runtime(id), { recursive: true, mode: 0o711 });
    await mkdir(L.runDir(id), { recursive: true, mode: 0o700 });
    await chown(L.runDir(id), user.uid, user.gid);
    // As the linux provider: `nproc` (and OpenMP, OpenBLAS) see the CPU quota.
    const env = { PATH: DEFAULT_PATH, HOME: user.home, USER: user.name, OMP_NUM_THREADS: String(Math.max(1, Math.ceil(spec.cpu))), ...spec.env };
    await writeOwned(path.join(L.runDir(id), "env"), envFile(env), user);
    if (spec.init.secret !== undefined) await writeOwned(path.join(L.runDir(id), "secret"), spec.init.secret, user);
    await writeFile(path.join(L.runtime(id), "resolv.conf"), this.#networks.resolvConf(), { mode: 0o644 });
    for (const [i, v] of (spec.volumes ?? []).entries()) {
      await prepareVolumeRoot(v.root, this.#volumeGid);
      await bindVolume(v, path.join(L.runtime(id), "volumes", String(i)), this.#volumeGid);
    }
    if (!state.upperDir) throw errors.failedPrecondition(`sandbox ${id}: the engine's storage driver has no upper directory (overlay2 is required)`);
    await prepareUser(state.upperDir, spec.rootfs, user);
  }

  async #attachNetwork(spec: SandboxSpec, pid: number): Promise<void> {
    if (!this.#nsenter) throw errors.failedPrecondition("nsenter is not installed (util-linux): needed for sandboxes with network access");
    const lease = await this.#networks.attach(pid, this.#nsenter, { mode: spec.network!, allowCidrs: spec.networkAllowList });
    await writeFile(leaseFile(this.layout, spec.id), JSON.stringify(lease), { mode: 0o600 });
  }

  /** Until the agent's socket accepts; fails early when the container exits or the agent died once. */
  async #waitForAgent(id: string, timeoutMs: number): Promise<void> {
    const socket = this.layout.socket(id);
    const restartsFile = path.join(this.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts));
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; ; i++) {
      if ((await accepts(socket)) === "accepting") return;
      if (i % 10 === 0) {
        const s = await this.#state(id);
        if (!s?.running) throw new Error(`the sandbox's first process exited with ${s?.exitCode ?? "?"} before listening on its socket${await this.#logTail(id)}`);
        const died = await readRestarts(restartsFile);
        if (died.count > 0) throw new Error(`the agent exited with ${died.lastStatus ?? "?"} before listening on its socket${await this.#logTail(id)}`);
      }
      if (Date.now() > deadline) throw new Error(`the sandbox's first process did not listen on ${socket} within ${timeoutMs} ms${await this.#logTail(id)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  async #logTail(id: string): Promise<string> {
    try {
      const buf = (await this.docker.getContainer(this.containerName(id)).logs({ stdout: true, stderr: true, tail: 20, follow: false })) as unknown as Buffer;
      const text = demux(buf).trim();
      return text ? `; its output:\n${text}` : "";
    } catch {
      return "";
    }
  }

  /** Changes a sandbox's egress, at once when it runs (see LinuxProvider.updateNetwork). Returns whether it took effect now. */
  async updateNetwork(id: string, network: NetworkMode, allowList: string[] = []): Promise<boolean> {
    validateId(id);
    const checked = validateSpec({ ...(await this.#record(id)).spec, network, networkAllowList: allowList });
    if (this.runtime === "runsc" && checked.network !== "none") throw errors.failedPrecondition(`network mode ${checked.network} is not available with the runsc runtime: only "none"`);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      rec.spec.network = checked.network;
      rec.spec.networkAllowList = checked.networkAllowList;
      await writeRecord(this.layout, rec);
      const state = await this.#state(id);
      if (!state?.running) return false;
      const lease = await readLease(this.layout, id);
      const policy = { mode: checked.network ?? "none", allowCidrs: checked.networkAllowList };
      if (lease) await this.#networks.applyPolicy(lease, policy);
      else if (policy.mode !== "none") await this.#attachNetwork(rec.spec, state.pid);
      return true;
    });
  }

  /** CPU and memory through the engine (live when running); the disk is fixed when the container is made. */
  async resize(id: string, resources: SandboxResources): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      const spec = validateSpec({ ...rec.spec, ...definedOf(resources) });
      if (spec.diskGiB !== rec.spec.diskGiB) throw errors.failedPrecondition(`sandbox ${id}: the docker provider cannot change a sandbox's disk size`);
      if (spec.cpu !== rec.spec.cpu || spec.memoryGiB !== rec.spec.memoryGiB) {
        // Debian's runsc has no `update`: the engine's live change fails inside the runtime.
        if (this.runtime === "runsc" && (await this.#state(id))?.running) throw errors.failedPrecondition(`sandbox ${id}: the runsc runtime cannot change limits while it runs; stop it first`);
        const memory = memoryBytesOf(spec);
        await this.docker.getContainer(this.containerName(id)).update({ NanoCpus: Math.max(10_000_000, Math.round(spec.cpu * 1e9)), Memory: memory, MemorySwap: memory });
      }
      rec.spec = { ...rec.spec, cpu: spec.cpu, memoryGiB: spec.memoryGiB };
      await writeRecord(this.layout, rec);
      return this.#info(rec);
    });
  }

  // ---- stop / destroy -----------------------------------------------------------------------

  async stop(id: string, options: StopOptions = {}): Promise<SandboxInfo> {
    validateId(id);
    return this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      if (options.force) await this.#kill(id);
      else {
        await this.docker
          .getContainer(this.containerName(id))
          .stop({ t: Math.ceil((options.graceMs ?? 5000) / 1000) })
          .catch((err: { statusCode?: number }) => {
            if (err.statusCode !== 304 && err.statusCode !== 404) throw err;
          });
      }
      await this.#teardown(id);
      if (rec.desired === "started") {
        rec.desired = "stopped";
        await writeRecord(this.layout, rec);
      }
      return this.#info(rec);
    });
  }

  async #kill(id: string): Promise<void> {
    await this.docker
      .getContainer(this.containerName(id))
      .kill({ signal: "SIGKILL" })
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode !== 409 && err.statusCode !== 404) throw err; // 409: not running
      });
    await this.docker.getContainer(this.containerName(id)).wait({ condition: "not-running" }).catch(() => undefined);
  }

  /** Removes what a start made on the host: the network lease, volume binds, the runtime dir. Idempotent. */
  async #teardown(id: string): Promise<void> {
    const L = this.layout;
    await this.#networks.tearDown(await readLease(L, id), id);
    for (const m of (await mountsUnder(path.join(L.runtime(id), "volumes"))).reverse()) await unmount(m);
    const left = await mountsUnder(L.runtime(id));
    if (left.length > 0) throw errors.internal(`sandbox ${id}: still mounted after stop: ${left.join(", ")}`);
    await rm(L.runtime(id), { recursive: true, force: true });
  }

  async #removeContainer(id: string): Promise<void> {
    await this.docker
      .getContainer(this.containerName(id))
      .remove({ force: true, v: true })
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode !== 404) throw err;
      });
  }

  async destroy(id: string): Promise<void> {
    validateId(id);
    await this.#lock.with(id, async () => {
      const rec = await readRecord(this.layout, id).catch(() => undefined);
      await this.#removeContainer(id);
      await this.#teardown(id);
      await rm(this.layout.sandboxDir(id), { recursive: true, force: true });
      if (rec) this.#uids.release(rec.hostUid);
    });
  }

  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    validateId(id);
    const checked = validateSpec({ ...(await this.#record(id)).spec, env });
    await this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      rec.spec = { ...rec.spec, env: checked.env };
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
    await this.#record(id);
    if (!(await this.#state(id))?.running) throw errors.failedPrecondition(`sandbox ${id} is not started`);
    return this.layout.socket(id);
  }

  async #record(id: string): Promise<SandboxRecord> {
    const rec = await readRecord(this.layout, id);
    if (!rec) throw errors.notFound(`sandbox ${id} not found`);
    return rec;
  }

  /** The container's state; undefined when the engine has no such container. */
  async #state(id: string): Promise<ContainerState | undefined> {
    try {
      const c = await this.docker.getContainer(this.containerName(id)).inspect();
      const data = (c.GraphDriver?.Data ?? {}) as Record<string, string>;
      return {
        running: c.State.Running,
        pid: c.State.Pid,
        startedAt: c.State.StartedAt,
        exitCode: c.State.ExitCode,
        oomKilled: c.State.OOMKilled,
        upperDir: data.UpperDir,
        workDir: data.WorkDir,
      };
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return undefined;
      throw err;
    }
  }

  async #info(rec: SandboxRecord): Promise<SandboxInfo> {
    const id = rec.spec.id;
    const state = await this.#state(id);
    const running = state?.running === true;
    const { secret: _secret, ...init } = rec.spec.init;
    const info: SandboxInfo = {
      id,
      state: running ? "started" : rec.desired === "started" || !state ? "error" : rec.desired,
      createdAt: new Date(rec.createdAt),
      hostUid: rec.hostUid,
      spec: { ...rec.spec, init },
    };
    const restarts = await readRestarts(path.join(this.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts)));
    if (running) {
      if (rec.startedAt) info.startedAt = new Date(rec.startedAt);
      const usage = await usageOfPid(state.pid);
      if (usage) info.usage = usage;
      info.agent = { running: await this.#agentRunning(id), restarts: restarts.count };
      if (restarts.at) info.agent.lastRestartAt = restarts.at;
    }
    if (!state) info.error = "its container is gone from the engine (removed outside Sandbar); destroy it";
    else if (info.state === "error") {
      const seen: string[] = [];
      if (state.oomKilled) seen.push("the sandbox ran out of memory");
      if (restarts.count > 0) seen.push(`its agent had been restarted ${restarts.count} time(s), last after exiting with ${restarts.lastStatus ?? "?"}`);
      info.error = `the sandbox's first process exited with code ${state.exitCode ?? "?"}${seen.length > 0 ? ` (${seen.join("; ")})` : ""}; start it again to recover it with its files`;
    }
    return info;
  }

  /** Whether a process of the container runs the agent's node (the engine lists them from the host). */
  async #agentRunning(id: string): Promise<boolean> {
    // gVisor's processes live in its own kernel: the engine lists only the sandbox's host processes.
    if (this.runtime === "runsc") return (await accepts(this.layout.socket(id))) === "accepting";
    try {
      const top = (await this.docker.getContainer(this.containerName(id)).top({ ps_args: "-o pid,args" })) as { Processes?: string[][] };
      return (top.Processes ?? []).some((p) => (p[1] ?? "").startsWith(SANDBOX_PATHS.node + " "));
    } catch {
      return false;
    }
  }

  // ---- writable layer -----------------------------------------------------------------------

  async pack(id: string): Promise<Readable> {
    validateId(id);
    const release = await this.#lock.acquire(id);
    try {
      const rec = await this.#record(id);
      const state = await this.#state(id);
      if (!state?.upperDir) throw errors.failedPrecondition(`sandbox ${id}: its container's writable layer is not on this host`);
      // The lock is held until tar is done with the layer.
      const handle = await packLayer(state.upperDir, rec.hostUid, path.join(this.layout.sandboxDir(id), "owner-map"), async () => release());
      return handle.stream;
    } catch (err) {
      release();
      throw err;
    }
  }

  async restore(id: string, archive: Readable): Promise<void> {
    archive.on("error", () => undefined); // see LinuxProvider.restore
    validateId(id);
    await this.#lock.with(id, async () => {
      const rec = await this.#record(id);
      const state = await this.#state(id);
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
    try {
      if ((await readdir(this.layout.runtimeDir)).length === 0) await rmdir(this.layout.runtimeDir);
    } catch {
      // missing or in use
    }
  }
}

async function checkHostPaths(spec: SandboxSpec): Promise<void> {
  if (!(await statOrFail("rootfs", spec.rootfs)).isDirectory()) throw errors.failedPrecondition(`rootfs ${spec.rootfs} is not a directory`);
  if (!(await statOrFail("init.node", spec.init.node)).isFile()) throw errors.failedPrecondition(`init.node ${spec.init.node} is not a file`);
  const bundle = await statOrFail("init.bundle", spec.init.bundle);
  if (bundle.isDirectory()) {
    if (!spec.init.main) throw errors.invalidArgument(`init.main is required: init.bundle ${spec.init.bundle} is a directory`);
    await statOrFail("init.main", path.join(spec.init.bundle, spec.init.main));
  }
  for (const m of spec.mounts ?? []) await statOrFail("mount source", m.source);
  // The engine parses binds as source:target:mode.
  for (const p of [spec.init.node, spec.init.bundle, ...(spec.mounts ?? []).flatMap((m) => [m.source, m.target]), ...(spec.volumes ?? []).map((v) => v.target)]) {
    if (p.includes(":") || p.includes(",")) throw errors.invalidArgument(`path ${p} cannot be bound by the Docker engine (it contains ':' or ',')`);
  }
}

/** A file only the sandbox user (and root) can read. */
async function writeOwned(file: string, content: string, owner: { uid: number; gid: number }): Promise<void> {
  await rm(file, { force: true });
  await writeFile(file, content, { mode: 0o600, flag: "wx" });
  await chown(file, owner.uid, owner.gid);
}

/** The engine's multiplexed log stream (8-byte frame headers) as text. */
function demux(buf: Buffer): string {
  let out = "";
  let i = 0;
  while (i + 8 <= buf.length) {
    const len = buf.readUInt32BE(i + 4);
    out += buf.subarray(i + 8, i + 8 + len).toString();
    i += 8 + len;
  }
  return out;
}

function leaseFile(layout: Layout, id: string): string {
  return path.join(layout.runtime(id), "network.json");
}

async function readLease(layout: Layout, id: string): Promise<NetworkLease | undefined> {
  try {
    return JSON.parse(await readFile(leaseFile(layout, id), "utf8")) as NetworkLease;
  } catch {
    return undefined;
  }
}
