import { chmod, mkdir, readdir, readFile, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { NetworkMode, SandboxInfo, SandboxProvider, SandboxSpec } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { validateId, validateSpec } from "../spec.ts";
import { type AgentRestarts, readRestarts } from "./agent-socket.ts";
import { KeyedLock } from "./keyed-lock.ts";
import { Layout } from "./layout.ts";
import { type NetworkLease, type NetworkOptions, type NetworkPolicy, SandboxNetworks } from "./network.ts";
import { listRecordIds, readAllRecords, readRecord, type SandboxRecord, writeRecord } from "./record.ts";
import { UidAllocator } from "./uids.ts";

// What every provider keeps on the host, whatever runs the sandboxes: the data dir's layout and
// records, a lock per sandbox, the uid range, the egress networks and their leases. Opened once
// per provider; a new one on the same data dir picks up the sandboxes an earlier one left.

/** The host options every provider takes. */
export interface HostOptions {
  /** Root of the runner's persistent state (sandboxes/, snapshots/). */
  dataDir: string;
  /** Where mount points and agent sockets live; default /run/sandbar/<hash of dataDir>. */
  runtimeDir?: string;
  /** Host uid range for sandboxes; default 1 500 000 000 + 65 536. */
  uidBase?: number;
  uidCount?: number;
  /** Group of volume directories, given to sandboxes that mount volumes; default the range's last uid (then never a sandbox's). */
  volumeGid?: number;
  /** Egress of sandboxes whose network mode is not "none" (subnet, nftables table, resolvers). */
  network?: NetworkOptions;
  log?: (line: string) => void;
}

/** Opens a provider over a runner's data dir: what a runtime is given to choose its provider. */
export type ProviderOpener<P extends SandboxProvider = SandboxProvider> = (host: HostOptions) => Promise<P>;

/** The PATH of a sandbox's first process. */
const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/sandbar/bin";

export class SandboxHost {
  readonly layout: Layout;
  readonly uids: UidAllocator;
  readonly networks: SandboxNetworks;
  readonly volumeGid: number;
  readonly lock = new KeyedLock();
  readonly log: (line: string) => void;

  private constructor(layout: Layout, uids: UidAllocator, networks: SandboxNetworks, volumeGid: number, log: (line: string) => void) {
    this.layout = layout;
    this.uids = uids;
    this.networks = networks;
    this.volumeGid = volumeGid;
    this.log = log;
  }

  /** Makes the data dir and marks the uids and networks of the sandboxes already on it as used. */
  static async open(o: HostOptions): Promise<SandboxHost> {
    const layout = new Layout(o.dataDir, o.runtimeDir);
    await mkdir(layout.sandboxesDir, { recursive: true, mode: 0o700 });
    const uids = new UidAllocator(o.uidBase, o.uidCount);
    const volumeGid = o.volumeGid ?? uids.base + uids.count - 1;
    if (volumeGid >= uids.base && volumeGid < uids.base + uids.count) uids.markUsed(volumeGid);
    const networks = await SandboxNetworks.create({ netnsPrefix: `sandbar-${layout.key}-`, ...o.network });
    const host = new SandboxHost(layout, uids, networks, volumeGid, o.log ?? (() => undefined));
    for (const id of await listRecordIds(layout)) {
      const rec = await readRecord(layout, id).catch(() => undefined);
      if (rec) uids.markUsed(rec.hostUid);
      const lease = await host.readLease(id);
      if (lease) networks.markUsed(lease);
    }
    return host;
  }

  /** The sandbox's record; NOT_FOUND when it has none. */
  async record(id: string): Promise<SandboxRecord> {
    const rec = await readRecord(this.layout, id);
    if (!rec) throw errors.notFound(`sandbox ${id} not found`);
    return rec;
  }

  /** A new record, refused when the id is taken (call under the sandbox's lock). */
  async assertNew(id: string): Promise<void> {
    if (await readRecord(this.layout, id)) throw errors.alreadyExists(`sandbox ${id} already exists`);
  }

  writeRecord(rec: SandboxRecord): Promise<void> {
    return writeRecord(this.layout, rec);
  }

  /** Every record on the data dir (unreadable ones logged and left out). */
  records(): Promise<SandboxRecord[]> {
    return readAllRecords(this.layout, this.log);
  }

  /** The record of a new sandbox, not started yet. */
  newRecord(spec: SandboxSpec, hostUid: number): SandboxRecord {
    return { version: 1, spec, hostUid, createdAt: new Date().toISOString(), desired: "created" };
  }

  /** Marks a started sandbox as meant to run from now on. */
  async markStarted(rec: SandboxRecord): Promise<void> {
    rec.desired = "started";
    rec.startedAt = new Date().toISOString();
    await writeRecord(this.layout, rec);
  }

  /** Marks a stopped sandbox as stopped on request (not an error). */
  async markStopped(rec: SandboxRecord): Promise<void> {
    if (rec.desired !== "started") return;
    rec.desired = "stopped";
    await writeRecord(this.layout, rec);
  }

  /** Replaces the environment of the sandbox's next starts. */
  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    validateId(id);
    const checked = validateSpec({ ...(await this.record(id)).spec, env });
    await this.lock.with(id, async () => {
      const rec = await this.record(id);
      rec.spec = { ...rec.spec, env: checked.env };
      await writeRecord(this.layout, rec);
    });
  }

  /**
   * Records a sandbox's new network policy and, while it runs (`running`), applies it: its nft
   * chain replaced in one transaction, or `attach` called to give a loopback-only one egress.
   * Returns whether it took effect now (false: stopped).
   */
  async updateNetwork(id: string, network: NetworkMode, allowList: string[], running: () => Promise<boolean>, attach: (rec: SandboxRecord, policy: NetworkPolicy) => Promise<void>): Promise<boolean> {
    validateId(id);
    const checked = validateSpec({ ...(await this.record(id)).spec, network, networkAllowList: allowList });
    return this.lock.with(id, async () => {
      const rec = await this.record(id);
      rec.spec.network = checked.network;
      rec.spec.networkAllowList = checked.networkAllowList;
      await writeRecord(this.layout, rec);
      if (!(await running())) return false;
      const policy = { mode: checked.network ?? "none", allowCidrs: checked.networkAllowList };
      const lease = await this.readLease(id);
      if (lease) await this.networks.applyPolicy(lease, policy);
      else if (policy.mode !== "none") await attach(rec, policy);
      return true;
    });
  }

  /** The network a sandbox got at its last start, if it still has one (kept in its runtime dir). */
  async readLease(id: string): Promise<NetworkLease | undefined> {
    try {
      return JSON.parse(await readFile(this.#leaseFile(id), "utf8")) as NetworkLease;
    } catch {
      return undefined;
    }
  }

  async writeLease(id: string, lease: NetworkLease): Promise<void> {
    await writeFile(this.#leaseFile(id), JSON.stringify(lease), { mode: 0o600 });
  }

  #leaseFile(id: string): string {
    return path.join(this.layout.runtime(id), "network.json");
  }

  /** The runtime directories of a start: traversable by the sandbox uid, writable only by root. */
  async makeRuntimeDirs(id: string): Promise<void> {
    const L = this.layout;
    await mkdir(L.runtimeDir, { recursive: true, mode: 0o711 });
    await chmod(L.runtimeDir, 0o711);
    await mkdir(L.runtime(id), { recursive: true, mode: 0o711 });
  }

  /** How often the sandbox's init restarted its agent. */
  agentRestarts(id: string): Promise<AgentRestarts> {
    return readRestarts(path.join(this.layout.runDir(id), path.basename(SANDBOX_PATHS.agentRestarts)));
  }

  /** Removes the runtime directory when no sandbox is left in it (a provider's close). */
  async removeRuntimeDirIfEmpty(): Promise<void> {
    try {
      if ((await readdir(this.layout.runtimeDir)).length === 0) await rmdir(this.layout.runtimeDir);
    } catch {
      // missing or in use
    }
  }
}

/** The environment of a sandbox's first process: a PATH, the user's, then the spec's. */
export function sandboxEnv(spec: SandboxSpec, user: { name: string; home: string }): Record<string, string> {
  // `nproc` (and OpenMP, OpenBLAS) honour OMP_NUM_THREADS: the CPU quota rather than the host's CPUs.
  return { PATH: DEFAULT_PATH, HOME: user.home, USER: user.name, OMP_NUM_THREADS: String(Math.max(1, Math.ceil(spec.cpu))), ...spec.env };
}

/** What every provider says of a sandbox, from its record: `running` now or not; usage, agent and error are the provider's. */
export function baseInfo(rec: SandboxRecord, running: boolean): SandboxInfo {
  const { secret: _secret, ...init } = rec.spec.init;
  const info: SandboxInfo = {
    id: rec.spec.id,
    state: running ? "started" : rec.desired === "started" ? "error" : rec.desired,
    createdAt: new Date(rec.createdAt),
    hostUid: rec.hostUid,
    spec: { ...rec.spec, init },
  };
  if (rec.startedAt && running) info.startedAt = new Date(rec.startedAt);
  return info;
}

/** Why a sandbox meant to run is not: `how` its first process ended, then what was seen. */
export function errorOf(how: string, seen: string[], restarts: AgentRestarts): string {
  if (restarts.count > 0) seen.push(`its agent had been restarted ${restarts.count} time(s), last after exiting with ${restarts.lastStatus ?? "?"}`);
  return `the sandbox's first process ${how}${seen.length > 0 ? ` (${seen.join("; ")})` : ""}; start it again to recover it with its files`;
}
