import { createHash, createHmac, randomBytes, randomUUID } from "node:crypto";
import { chmod, mkdir, readFile, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import { type ChangesPart, type ChangesQuery, type InitCommand, type ProviderOpener, readChangeset, SANDBOX_PATHS, type SandboxInfo, type SandboxProvider, type SandboxSpec } from "@sandbar/runner";
import { snapshotNodeArgs } from "@sandbar/agent/snapshot-blob";
import { ensureDefaultSnapshot, LinuxProvider, type Snapshot } from "@sandbar/runner/linux";
import { ImageStore, sandboxSpecFor, type ImageStoreOptions, type RegistryCredentials } from "@sandbar/runner/images";
import type { BuildSnapshotRequest, LogChunk, SnapshotProgress } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { LayerExport } from "@sandbar/runner/runtime";
import { HostBuilds } from "../builds/host-builds.ts";
import { exportLayers } from "./layer-export.ts";
import { type AgentDial, type RuntimeHealth, type RuntimeResources, type RuntimeSandbox, type RuntimeSandboxSpec, type SandboxRuntime, type RuntimeNetwork, unixAgentDial } from "./runtime.ts";

// Sandboxes on this host: a provider (linux by default) over `<SANDBAR_DATA_DIR>/runner`, every sandbox made
// from the default snapshot, with the agent as its first process. Each agent gets its own secret,
// HMAC-SHA256(host secret, sandbox id): a restarted server derives it again to reach sandboxes it
// re-adopts, and no per-sandbox secret is ever stored by the control plane.

/** The agent bundle `node packages/agent/build.ts` writes: a directory whose entry is agent.mjs. */
const DEFAULT_AGENT_BUNDLE = fileURLToPath(new URL("../../../agent/dist", import.meta.url));
const AGENT_ENTRY = "agent.mjs";
/**
 * The agent loads what every first call needs (node:http2, Connect, the info, file and process
 * services) right after it listens, while the create answers and the first call travels, rather
 * than on that call: a faster first call for about 12 MB more private memory per idle sandbox.
 */
const AGENT_ARGS = ["--preload"];
/**
 * The agent makes no TLS connection of its own, but node:http2 loads node:tls, which starts
 * loading node's bundled root certificates: 7 ms of the agent's first call on this machine.
 * With OpenSSL's store instead, nothing is loaded until a TLS connection would need it.
 */
const AGENT_NODE_ARGS = ["--use-openssl-ca"];

/**
 * The first process for an agent bundle: a directory holding agent.mjs (mounted whole: its
 * chunks and node_modules come along), or a single script file.
 */
export async function agentInit(bundle = DEFAULT_AGENT_BUNDLE): Promise<Omit<InitCommand, "secret">> {
  const resolved = path.resolve(bundle);
  const isDir = await stat(resolved).then((s) => s.isDirectory(), () => resolved === DEFAULT_AGENT_BUNDLE);
  return isDir ? bundleInit(resolved) : { node: process.execPath, bundle: resolved };
}

/**
 * A bundle directory run by this node (sandboxes get process.execPath): from the bundle's startup
 * snapshot when it holds one built by this node's version (packages/agent/snapshot-blob.ts),
 * otherwise agent.mjs.
 */
function bundleInit(dir: string): Omit<InitCommand, "secret"> {
  const nodeArgs = [...AGENT_NODE_ARGS, ...snapshotNodeArgs(dir, SANDBOX_PATHS.agent)];
  return { node: process.execPath, bundle: dir, main: AGENT_ENTRY, args: AGENT_ARGS, nodeArgs };
}

export interface LocalRuntimeOptions<P extends SandboxProvider = SandboxProvider> {
  /** The runner's data dir (sandboxes/, host-secret, runner-id). */
  dataDir: string;
  /** Where the default snapshot is built and cached; default `dataDir`. */
  snapshotCacheDir?: string;
  /** The sandbox's first process; default: this node running the agent bundle (see agentInit). The secret is added per sandbox. */
  init?: Omit<InitCommand, "secret">;
  /** Host uid range of the sandboxes; default a 65 536-uid slot chosen by the data dir. */
  uidBase?: number;
  uidCount?: number;
  /** Processes and threads per sandbox. */
  pidsLimit?: number;
  /** Host directory of a volume (volumes/storage.ts); sandboxes with volumes need it. */
  volumeRoot?: (volumeId: string) => string;
  /** Group of volume directories; default the uid slot's last id (a volume root shared between hosts needs SHARED_VOLUME_GID). */
  volumeGid?: number;
  /** The image store under `<dataDir>/images`: Docker Hub mirror, insecure registries, caps. */
  images?: Omit<ImageStoreOptions, "dataDir" | "log">;
  /** IPv4 range the /30s of sandboxes with egress come from (SANDBAR_SANDBOX_SUBNET). */
  sandboxSubnet?: string;
  /** Opens the provider over the runtime's data dir and uid range; default the linux provider (boot.ts picks SANDBAR_PROVIDER's). */
  provider?: ProviderOpener<P>;
  log?: (line: string) => void;
}

const UID_SLOT = 65_536;
const UID_FIRST = 1_700_000_000;
const UID_SLOTS = 6000; // stays below 2^31
/** The volume group of every runtime mounting a shared volume root: one id below every uid slot, so never a sandbox's uid. */
export const SHARED_VOLUME_GID = UID_FIRST - 1;

/** `P`: the provider's type, for callers (tests, benches) that know which one they opened. */
export class LocalRuntime<P extends SandboxProvider = LinuxProvider> implements SandboxRuntime {
  readonly runnerId: string;
  readonly agentsOnThisHost = true;
  readonly provider: P;
  /** First host uid of this runner's sandboxes (the range is `uidCount` long). */
  readonly uidBase: number;
  readonly #hostSecret: Buffer;
  readonly #init: Omit<InitCommand, "secret">;
  readonly #snapshotDir: string;
  readonly #pidsLimit: number;
  readonly #volumeRoot?: (volumeId: string) => string;
  readonly #log: (line: string) => void;
  readonly #imageOptions: ImageStoreOptions;
  #images: Promise<ImageStore> | undefined;
  #builds: HostBuilds | undefined;

  private constructor(provider: P, runnerId: string, hostSecret: Buffer, uidBase: number, o: LocalRuntimeOptions<P>) {
    this.provider = provider;
    this.uidBase = uidBase;
    this.runnerId = runnerId;
    this.#hostSecret = hostSecret;
    this.#init = o.init ?? bundleInit(DEFAULT_AGENT_BUNDLE);
    this.#snapshotDir = o.snapshotCacheDir ?? o.dataDir;
    this.#pidsLimit = o.pidsLimit ?? 4096;
    this.#volumeRoot = o.volumeRoot;
    this.#log = o.log ?? (() => undefined);
    this.#imageOptions = { ...o.images, dataDir: o.dataDir, log: (l) => this.#log(`images: ${l}`) };
  }

  /** Opens the provider (root, bubblewrap and cgroups are checked) and the runner's identity. */
  static open(o: LocalRuntimeOptions<LinuxProvider> & { provider?: undefined }): Promise<LocalRuntime>;
  static open<P extends SandboxProvider>(o: LocalRuntimeOptions<P> & { provider: ProviderOpener<P> }): Promise<LocalRuntime<P>>;
  static async open(o: LocalRuntimeOptions): Promise<LocalRuntime<SandboxProvider>> {
    const dataDir = path.resolve(o.dataDir);
    await mkdir(dataDir, { recursive: true, mode: 0o700 });
    const hostSecret = await loadHostSecret(path.join(dataDir, "host-secret"));
    const runnerId = await loadRunnerId(path.join(dataDir, "runner-id"));
    const slot = createHash("sha256").update(dataDir).digest().readUInt32BE(0) % UID_SLOTS;
    const uidBase = o.uidBase ?? UID_FIRST + slot * UID_SLOT;
    const common = { dataDir, uidBase, uidCount: o.uidCount ?? UID_SLOT, log: o.log, network: { subnet: o.sandboxSubnet }, ...(o.volumeGid !== undefined ? { volumeGid: o.volumeGid } : {}) };
    const provider = await (o.provider ?? LinuxProvider.open)(common);
    const runtime = new LocalRuntime(provider, runnerId, hostSecret, uidBase, { ...o, dataDir });
    // Built (once per host, a minute or two) while the server starts serving, not on the first create.
    runtime.#snapshot().catch((err: unknown) => runtime.#log(`default snapshot: ${(err as Error).message}`));
    return runtime;
  }

  async assertReady(): Promise<void> {
    const { node, bundle, main } = this.#init;
    for (const [what, file] of [["node", node], ["agent bundle", main ? path.join(bundle, main) : bundle]] as const) {
      const found = await stat(file).then(() => true, () => false);
      if (!found) {
        const hint = bundle === DEFAULT_AGENT_BUNDLE ? ": build it with `node packages/agent/build.ts` (or set SANDBAR_AGENT_BUNDLE)" : "";
        throw errors.unavailable(`Sandboxes cannot start: the ${what} ${file} does not exist${hint}`);
      }
    }
  }

  #snapshot(): Promise<Snapshot> {
    return ensureDefaultSnapshot({ dataDir: this.#snapshotDir, onProgress: compactProgress((l) => this.#log(`snapshot: ${l}`)), log: this.#log });
  }

  /** Opened on first use (it removes what dead pulls left in its temp dir). */
  images(): Promise<ImageStore> {
    this.#images ??= ImageStore.open(this.#imageOptions);
    return this.#images;
  }

  buildSnapshot(requests: AsyncIterable<BuildSnapshotRequest>, signal: AbortSignal): AsyncIterable<SnapshotProgress> {
    this.#builds ??= new HostBuilds(() => this.images());
    return this.#builds.build(requests, signal);
  }

  snapshotLogs(ref: string, follow: boolean, signal: AbortSignal): AsyncIterable<LogChunk> {
    this.#builds ??= new HostBuilds(() => this.images());
    return this.#builds.logs(ref, follow, signal);
  }

  async holdsImage(digest: string): Promise<boolean> {
    return (await (await this.images()).get(digest)) !== undefined;
  }

  /** Pulls `name` (pinned to `digest`) into this host's store, e.g. an image another runner built and pushed. */
  async pullImage(digest: string, name: string, credentials?: RegistryCredentials, onProgress?: (line: string) => void): Promise<void> {
    const image = await (await this.images()).pull(name, { credentials, onProgress });
    if (image.digest !== digest) throw errors.failedPrecondition(`${name} is ${image.digest} on its registry, not ${digest}`);
  }

  async #spec(s: RuntimeSandboxSpec): Promise<SandboxSpec> {
    if (s.image !== undefined) {
      const image = await (await this.images()).get(s.image);
      if (!image) throw errors.failedPrecondition(`The image ${s.image} of this sandbox is not on this host any more`);
      // The image's own root, no host binds: what the agent needs (node's libraries) is the image's.
      return sandboxSpecFor(image, this.#specOn({ rootfs: image.rootfs, mounts: [], kind: "host-usr" }, s));
    }
    return this.#specOn(await this.#snapshot(), s);
  }

  #specOn(snapshot: Snapshot, s: RuntimeSandboxSpec): SandboxSpec {
    return {
      id: s.id,
      rootfs: snapshot.rootfs,
      mounts: snapshot.mounts,
      cpu: s.cpu,
      memoryGiB: s.memoryGiB,
      diskGiB: s.diskGiB,
      pidsLimit: this.#pidsLimit,
      env: s.env,
      user: s.user,
      volumes: (s.volumes ?? []).map((v) => {
        if (!this.#volumeRoot) throw errors.failedPrecondition("Volumes are not available on this runner");
        return { root: this.#volumeRoot(v.volumeId), target: v.mountPath, ...(v.subpath ? { subpath: v.subpath } : {}) };
      }),
      network: s.network?.mode ?? "none",
      ...(s.layers?.length ? { layers: s.layers } : {}),
      networkAllowList: s.network?.allowList,
      init: { ...this.#init, secret: this.agentSecret(s.id) },
    };
  }

  async create(s: RuntimeSandboxSpec): Promise<void> {
    await this.assertReady();
    if (!(await this.inspect(s.id))) await this.provider.create(await this.#spec(s));
    await this.provider.start(s.id);
  }

  async start(id: string): Promise<void> {
    await this.provider.start(id);
  }

  async stop(id: string, options: { force?: boolean } = {}): Promise<void> {
    await this.provider.stop(id, { force: options.force });
  }

  destroy(id: string): Promise<void> {
    return this.provider.destroy(id);
  }

  async pause(id: string): Promise<void> {
    await this.provider.pause(id);
  }

  async resume(id: string): Promise<void> {
    await this.provider.resume(id);
  }

  removeLeftovers(unclaimed: string[]): Promise<string[]> {
    return this.provider.removeLeftovers(unclaimed);
  }

  setEnv(id: string, env: Record<string, string>): Promise<void> {
    return this.provider.setEnv(id, env);
  }

  async setNetwork(id: string, network: RuntimeNetwork): Promise<void> {
    await this.provider.updateNetwork(id, network.mode, network.allowList);
  }

  async resize(id: string, resources: RuntimeResources): Promise<void> {
    await this.provider.resize(id, resources);
  }

  pack(id: string): Promise<Readable> {
    return this.provider.pack(id);
  }

  changes(id: string, query: ChangesQuery): AsyncIterable<ChangesPart> {
    const provider = this.provider;
    return readChangeset(async () => {
      if (!provider.changeLayers) throw errors.invalidArgument(`changes are not available with the ${provider.name} provider`);
      return provider.changeLayers(id, { consistent: query.consistent, since: query.since?.length ? query.since : undefined });
    }, query);
  }

  async restore(s: RuntimeSandboxSpec, archive: Readable): Promise<void> {
    await this.assertReady();
    if (!(await this.inspect(s.id))) await this.provider.create(await this.#spec(s));
    await this.provider.restore(s.id, archive);
  }

  async captureLayer(id: string, layerId: string): Promise<void> {
    await this.#layered("captureLayer").call(this.provider, id, layerId);
  }

  async squashLayers(layerIds: string[], layerId: string): Promise<void> {
    await this.#layered("squashLayers").call(this.provider, layerIds, layerId);
  }

  async removeLayers(layerIds: string[]): Promise<void> {
    if (this.provider.removeLayers) await this.provider.removeLayers(layerIds);
  }

  async listLayers(): Promise<Array<{ id: string; createdAt: Date }>> {
    return (await this.provider.listLayers?.()) ?? [];
  }

  /** Captured layers over their base as an OCI image, pushed (layer-export.ts): a snapshot that travels. */
  exportLayers(req: LayerExport): Promise<{ digest: string; layers: number; bytes: number }> {
    return exportLayers({ provider: this.provider, images: () => this.images(), defaultSnapshot: () => this.#snapshot(), insecureRegistries: this.#imageOptions.insecureRegistries, log: this.#log }, req);
  }

  /** A layer method of the provider, or the 400 of one that has none (Docker: no overlay upper to capture). */
  #layered<K extends "captureLayer" | "squashLayers">(method: K): NonNullable<SandboxProvider[K]> {
    const fn = this.provider[method];
    if (!fn) throw errors.invalidArgument(`Snapshots and forks of a running sandbox are not supported by the ${this.provider.name} provider`);
    return fn;
  }

  async list(): Promise<RuntimeSandbox[]> {
    return (await this.provider.list()).map((i) => ({ id: i.id, state: i.state, error: i.error, rootfs: i.spec.rootfs }));
  }

  async inspect(id: string): Promise<RuntimeSandbox | undefined> {
    try {
      const i = await this.provider.inspect(id);
      return { id: i.id, state: i.state, error: i.error, health: healthOf(i), ...(i.paused ? { pausedMemory: i.paused } : {}) };
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.NotFound) return undefined;
      throw err;
    }
  }

  async connectAgent(id: string): Promise<AgentDial> {
    return unixAgentDial(await this.agentSocket(id), this.agentSecret(id));
  }

  /** Host path of the agent's unix socket; the sandbox must be started. */
  agentSocket(id: string): Promise<string> {
    return this.provider.connect(id);
  }

  agentSecret(id: string): string {
    return createHmac("sha256", this.#hostSecret).update(id).digest("hex");
  }

  close(): Promise<void> {
    return this.provider.close();
  }
}

function healthOf({ usage, agent }: SandboxInfo): RuntimeHealth | undefined {
  if (!usage || !agent) return undefined;
  const { oomKills, pidsLimitHits, memoryBytes, memoryLimitBytes, pids, pidsLimit, pidsSaturated = false } = usage;
  return { agentRunning: agent.running, agentRestarts: agent.restarts, lastAgentRestartAt: agent.lastRestartAt, oomKills, pidsLimitHits, memoryBytes, memoryLimitBytes, pids, pidsLimit, pidsSaturated };
}

/** debootstrap prints a line per package and step; the log gets each step and a count every 25 packages. */
function compactProgress(log: (line: string) => void): (line: string) => void {
  const steps: Record<string, string> = { Retrieving: "downloading", Validating: "downloading", Extracting: "extracting", Unpacking: "unpacking", Configuring: "configuring" };
  let step = "";
  let count = 0;
  return (line) => {
    const m = /^I: (\w+) \S/.exec(line);
    const now = m ? steps[m[1]!] : undefined;
    if (!now) return log(line);
    if (now !== step) {
      step = now;
      count = 0;
      log(`${step} packages`);
    }
    if (m![1] !== "Validating" && ++count % 25 === 0) log(`${step}: ${count} packages`);
  };
}

/** 32 random bytes, kept 0600 in the data dir; created once, race-free (O_EXCL). */
async function loadHostSecret(file: string): Promise<Buffer> {
  try {
    await writeFile(file, randomBytes(32).toString("hex") + "\n", { mode: 0o600, flag: "wx" });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  await chmod(file, 0o600);
  const hex = (await readFile(file, "utf8")).trim();
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new Error(`${file} is not a host secret (64 hex digits); remove it only if no sandbox runs`);
  return Buffer.from(hex, "hex");
}

async function loadRunnerId(file: string): Promise<string> {
  try {
    await writeFile(file, randomUUID() + "\n", { mode: 0o644, flag: "wx" });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  return (await readFile(file, "utf8")).trim();
}
