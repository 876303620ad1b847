import { createHash, randomBytes, randomUUID, timingSafeEqual } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import type { SandboxRecord, SandboxVolumeMount } from "../db/entities.ts";
import type { AgentEndpoint } from "../toolbox/agent-locator.ts";
import type { Exec } from "../db/exec.ts";
import { LayerFiles } from "./layer-files.ts";
import { type NetworkFields, runtimeNetwork } from "./network-policy.ts";
import type { SharedLocks } from "./cluster-locks.ts";
import { OperationLocks } from "./operation-locks.ts";
import type { RuntimeSandboxSpec, SandboxRuntime } from "./runtime.ts";
import { fitsInProcess, noAvailableRunners } from "./sandbox-class.ts";
import { isEphemeral, isErrored } from "./states.ts";
import { type SandboxPatch, SandboxStore } from "./store.ts";
import type { WarmPool } from "./warm-pool.ts";
import { EndpointCache } from "./endpoint-cache.ts";
import type { RegistryCredentials } from "@sandbar/runner/images";

// The sandbox lifecycle (reference §4.3): every transition with the reference's preconditions,
// status codes and messages. One operation at a time per sandbox; an operation records where it
// is going (desiredState) before it works and where the sandbox is (state) after, so a crash in
// between is visible and reconcile.ts can finish the job. API calls wait for their operation up
// to `waitMs` (30 s, like the reference's create and start), then answer the state as it is.

export interface SandboxManagerOptions {
  orm: MikroORM;
  runtime: SandboxRuntime;
  /** The server's data dir: archives/ and backups/ go there. */
  dataDir: string;
  /** Length of a timer "minute" (activity stamps are throttled to a sixth of it, at most 10 s). */
  minuteMs?: number;
  waitMs?: number;
  log?: (line: string) => void;
  /** Started sandboxes that creates of their shape take over. */
  pool?: WarmPool;
  /** The registered runners (runners/directory.ts): regions that have some place their sandboxes there. */
  runners?: RunnerDirectory;
  /** Where a runner pulls a snapshot's image from: its pinned name and the organization's credentials for it. */
  imageSource?: ImageSource;
  /** Locks shared by every control process of the database (cluster-locks.ts): one operation per sandbox among them all. */
  sharedLocks?: SharedLocks;
}

export type ImageSource = (organizationId: string, digest: string) => Promise<{ name: string; credentials?: RegistryCredentials }>;

/** Where sandboxes go besides this server's own runtime. */
export interface RunnerDirectory {
  /** A registered runner's runtime by the id its sandboxes record; undefined when no runner has that id. */
  runtime(runnerId: string): Promise<SandboxRuntime | undefined>;
  /** Whether the region's sandboxes go to registered runners (it has some) rather than this server's runtime. */
  servesRegion(regionId: string): Promise<boolean>;
  /** Picks a runner of the region inside the caller's transaction; undefined when the region has none registered. */
  place(exec: Exec, regionId: string, need: PlacementNeed): Promise<Placement | undefined>;
  /** A runner of the region to run a declarative build (as placement picks, without reserving). */
  builder?(regionId: string, need: { cpu: number; memory: number; disk: number }): Promise<string>;
  /** Records that a runner now holds an image (placement prefers it for sandboxes of that image). */
  holds?(runnerId: string, digest: string): Promise<void>;
  /** Removes an image no sandbox uses any more from every runner holding it. */
  dropImage?(digest: string, log?: (line: string) => void): Promise<void>;
  /** Ids (as sandboxes record them) of the runners that stopped answering: their sandboxes read as `unknown`. */
  unresponsive(): Promise<ReadonlySet<string>>;
  /** Ids (as sandboxes record them) of the runners that answer now. */
  ready(): Promise<string[]>;
}

/** What a sandbox needs of its runner. */
export interface PlacementNeed {
  cpu: number;
  memory: number;
  disk: number;
  gpu: number;
  sandboxClass: string;
  /** GPU models in order of preference; empty or absent: any. */
  gpuTypes?: readonly string[];
  imageRef?: string | null;
  volumes?: readonly unknown[] | null;
}

/** The runner placement chose, and the model of GPU the sandbox gets there (null without GPU). */
export interface Placement {
  runnerId: string;
  gpuType: string | null;
}

/** A validated create request. */
export interface NewSandbox {
  organizationId: string;
  regionId: string;
  name?: string;
  snapshot: string;
  /** The snapshot's image (manifest digest); absent for the default snapshot. */
  imageRef?: string;
  user: string;
  env: Record<string, string>;
  labels: Record<string, string>;
  public: boolean;
  cpu: number;
  memory: number;
  disk: number;
  /** GPUs (0 or 1): only a runner with a GPU free takes it. */
  gpu: number;
  /** GPU models in order of preference; empty: any. */
  gpuTypes: string[];
  /** container, linux-vm, android or windows: only a runner of that class takes it. */
  sandboxClass: string;
  autoStopInterval: number;
  autoArchiveInterval: number;
  autoDeleteInterval: number;
  /** Volumes to mount, resolved (volumes/sandbox-mounts.ts). */
  volumes: SandboxVolumeMount[];
  networkBlockAll: boolean;
  networkAllowList: string | null;
}

/** A sandbox's resources as stored: cores, GiB of memory, GiB of disk. */
export interface Resources {
  cpu: number;
  memory: number;
  disk: number;
}

/** Where the toolbox reaches a sandbox's agent. */
export type { AgentEndpoint };

/**
 * How an operation ended: `failed` carries the reason when the sandbox did not get there; `row`,
 * the sandbox as its last write committed it (the answer, without reading it again).
 */
interface Outcome {
  failed?: string;
  row?: SandboxRecord;
}

export const stateChangeInProgress = () => new ConnectError("Sandbox state change in progress", Code.Aborted);
const bad = (message: string) => errors.invalidArgument(message);

/** A fresh preview token: 32 lower-case alphanumerics, like the reference's. */
export function newAuthToken(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = randomBytes(32);
  let out = "";
  for (const b of bytes) out += alphabet[b % alphabet.length];
  return out;
}

/** Whether `given` is the sandbox's current preview token (constant time in content and length). */
export function isAuthToken(authToken: string, given: string): boolean {
  const digest = (v: string) => createHash("sha256").update(v).digest();
  return timingSafeEqual(digest(given), digest(authToken));
}

export class SandboxManager {
  readonly runtime: SandboxRuntime;
  readonly runners?: RunnerDirectory;
  readonly #imageSource?: ImageSource;
  readonly store: SandboxStore;
  readonly files: LayerFiles;
  readonly locks: OperationLocks;
  readonly #backups = new Map<string, Promise<void>>();
  readonly #touched = new Map<string, number>();
  readonly #endpoints = new EndpointCache();
  readonly #touchEveryMs: number;
  readonly #waitMs: number;
  readonly #log: (line: string) => void;
  readonly pool: WarmPool | undefined;
  #closing = false;

  constructor(o: SandboxManagerOptions) {
    this.runtime = o.runtime;
    this.store = new SandboxStore(o.orm);
    this.store.onWrite = (id) => this.#endpoints.evict(id);
    this.files = new LayerFiles(o.dataDir);
    this.#touchEveryMs = Math.min(10_000, Math.floor((o.minuteMs ?? 60_000) / 6));
    this.#waitMs = o.waitMs ?? 30_000;
    this.#log = o.log ?? (() => undefined);
    this.pool = o.pool;
    this.runners = o.runners;
    this.#imageSource = o.imageSource;
    this.locks = new OperationLocks(o.sharedLocks);
  }

  // ---- lookups -------------------------------------------------------------------------------

  get(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return this.store.find(organizationId, idOrName);
  }

  /** The toolbox's way in: a started sandbox of the caller's organization. */
  async agentFor(organizationId: string, idOrName: string): Promise<AgentEndpoint> {
    const hit = this.#endpoints.get(organizationId, idOrName);
    if (hit) {
      if (this.locks.busy(hit.sandboxId)) throw stateChangeInProgress();
      return hit;
    }
    const since = this.#endpoints.generation();
    const row = await this.store.find(organizationId, idOrName);
    const endpoint = await this.#endpoint(row);
    if ((await this.runtimeOf(row)).agentsOnThisHost) this.#endpoints.set(organizationId, idOrName, endpoint, since);
    return endpoint;
  }

  /**
   * The toolbox's way in for clients that hold no API key: the sandbox's preview token. The
   * toolbox is the reference's port 2280, which needs the token even on a public sandbox. A
   * wrong token is UNAUTHENTICATED; an unknown sandbox NOT_FOUND.
   */
  async previewToken(sandboxId: string, token: string): Promise<AgentEndpoint> {
    const row = await this.store.byId(sandboxId);
    if (!row || row.state === "destroyed" || (isErrored(row.state) && row.desiredState === "destroyed")) {
      throw errors.notFound(`Sandbox with ID or name ${sandboxId} not found`);
    }
    if (!isAuthToken(row.authToken, token)) throw errors.unauthenticated();
    return this.#endpoint(row);
  }

  async #endpoint(row: SandboxRecord): Promise<AgentEndpoint> {
    if (isErrored(row.state)) throw bad("Sandbox is not running");
    if (this.locks.busy(row.id) || row.state !== row.desiredState) throw stateChangeInProgress();
    if (row.state !== "started") throw bad("Sandbox is not running");
    const rt = await this.runtimeOf(row);
    try {
      const dial = await rt.connectAgent(row.id);
      return { sandboxId: row.id, key: dial.key, secret: dial.secret, api: dial.api, tunnel: dial.tunnel };
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.FailedPrecondition) throw bad("Sandbox is not running");
      throw err;
    }
  }

  /** Records activity (what the auto-stop timer measures), at most once per throttle period. */
  touch(id: string): void {
    const now = Date.now();
    const last = this.#touched.get(id);
    if (last !== undefined && now - last < this.#touchEveryMs) return;
    this.#touched.set(id, now);
    if (this.#touched.size > 10_000) this.#touched.clear();
    this.store.touch(id, new Date(now)).catch((err: unknown) => this.#log(`sandbox ${id}: activity stamp failed: ${String(err)}`));
  }

  // ---- create --------------------------------------------------------------------------------

  async create(input: NewSandbox): Promise<SandboxRecord> {
    this.#assertOpen();
    // Pool sandboxes are loopback only, of the default snapshot, without volumes: any other create is made for its request.
    const placed = (await this.runners?.servesRegion(input.regionId)) ?? false;
    // This server's own runtime is a container runner without GPUs (the pool's sandboxes too).
    const inProcess = fitsInProcess(input);
    const warm = !placed && inProcess && input.imageRef === undefined && input.volumes.length === 0 && input.networkBlockAll && !input.networkAllowList && this.pool?.fits(input) ? this.pool.claim() : undefined;
    if (!warm && !placed && inProcess) await this.runtime.assertReady();
    const id = warm ?? randomUUID();
    const now = new Date();
    const row: SandboxRecord = {
      id,
      organizationId: input.organizationId,
      name: input.name ?? id,
      snapshot: input.snapshot,
      osUser: input.user,
      env: input.env,
      labels: input.labels,
      public: input.public,
      cpu: input.cpu,
      gpu: input.gpu,
      gpuType: null,
      sandboxClass: input.sandboxClass,
      memory: input.memory,
      disk: input.disk,
      state: "unknown",
      desiredState: "started",
      errorReason: null,
      backupState: "None",
      backupCreatedAt: null,
      autoStopInterval: input.autoStopInterval,
      autoArchiveInterval: input.autoArchiveInterval,
      autoDeleteInterval: input.autoDeleteInterval,
      createdAt: now,
      updatedAt: now,
      lastActivityAt: now,
      authToken: newAuthToken(),
      regionId: input.regionId,
      runnerId: this.runtime.runnerId,
      volumes: input.volumes,
      imageRef: input.imageRef ?? null,
      networkBlockAll: input.networkBlockAll,
      networkAllowList: input.networkAllowList,
      buildInfo: null,
    };
    if (warm) return this.#takeOver(row);
    const op = this.locks.tryRunNew(id, async (held) => {
      // A region with registered runners: one is picked in the insert's transaction (placement.ts).
      // What this server's runtime cannot take is refused where placement would be: after the quota (the reference's order).
      const place = placed ? (exec: Exec) => this.#place(exec, row, input.gpuTypes) : inProcess ? undefined : () => Promise.reject(noAvailableRunners(input.gpuTypes));
      await this.store.insert(row, place, held);
      return this.driveCreate(row);
    })!;
    const made = await this.#answer(id, op, "Sandbox failed to start");
    if (made.state === "started" && made.desiredState === "started") this.#readyForCalls(made);
    return made;
  }

  /**
   * A sandbox just started, answered to its creator: its first toolbox call finds the agent
   * without a lookup (dialled while the answer goes out; a write to any sandbox meanwhile and the
   * call looks it up as before), and writes no activity stamp (its row has one from this moment).
   */
  #readyForCalls(row: SandboxRecord): void {
    this.#touched.set(row.id, Date.now());
    const since = this.#endpoints.generation();
    void (async () => {
      const rt = await this.runtimeOf(row);
      if (!rt.agentsOnThisHost || this.locks.busy(row.id)) return;
      const dial = await rt.connectAgent(row.id);
      this.#endpoints.set(row.organizationId, row.id, { sandboxId: row.id, key: dial.key, secret: dial.secret, api: dial.api, tunnel: dial.tunnel }, since);
    })().catch(() => undefined);
  }

  /**
   * A create from a declarative build (reference: pending_build -> building_snapshot -> creating
   * -> started, or build_failed): the row is admitted (quota), then answered at once in
   * pending_build, as the reference answers (clients poll, and follow the build logs while it
   * builds); in the background `build` makes the image (its manifest digest) and the sandbox is
   * created from it.
   */
  async createFromBuild(input: NewSandbox, buildInfo: NonNullable<SandboxRecord["buildInfo"]>, build: (id: string, runnerId: string) => Promise<string>): Promise<SandboxRecord> {
    this.#assertOpen();
    // A region with registered runners: the sandbox is placed at once, and built on its runner.
    const placed = (await this.runners?.servesRegion(input.regionId)) ?? false;
    if (!placed) {
      if (!fitsInProcess(input)) throw noAvailableRunners(input.gpuTypes); // this server's runtime: a container runner without GPUs
      await this.runtime.assertReady();
    }
    const id = randomUUID();
    const now = new Date();
    const row: SandboxRecord = {
      id, organizationId: input.organizationId, name: input.name ?? id, snapshot: null, osUser: input.user, env: input.env, labels: input.labels, public: input.public,
      cpu: input.cpu, gpu: input.gpu, gpuType: null, sandboxClass: input.sandboxClass, memory: input.memory, disk: input.disk, state: "pending_build", desiredState: "started", errorReason: null, backupState: "None", backupCreatedAt: null,
      autoStopInterval: input.autoStopInterval, autoArchiveInterval: input.autoArchiveInterval, autoDeleteInterval: input.autoDeleteInterval,
      createdAt: now, updatedAt: now, lastActivityAt: now, authToken: newAuthToken(), regionId: input.regionId, runnerId: this.runtime.runnerId,
      volumes: input.volumes, imageRef: null, networkBlockAll: input.networkBlockAll, networkAllowList: input.networkAllowList, buildInfo,
    };
    let admitted!: () => void;
    const inserted = new Promise<void>((resolve) => (admitted = resolve));
    const op = this.locks.tryRun(id, async (): Promise<Outcome> => {
      await this.store.insert(row, placed ? (exec: Exec) => this.#place(exec, row, input.gpuTypes) : undefined);
      admitted();
      let imageRef: string;
      try {
        await this.store.update(id, { state: "building_snapshot" });
        imageRef = await build(id, row.runnerId ?? this.runtime.runnerId);
      } catch (err) {
        const reason = reasonOf(err);
        await this.store.update(id, { state: "build_failed", errorReason: reason });
        return { failed: reason };
      }
      await this.store.update(id, { state: "unknown", imageRef }); // reported as creating
      return this.driveCreate({ ...row, imageRef });
    })!;
    op.catch(() => undefined); // after the insert, failures are recorded on the sandbox
    await Promise.race([inserted, op]); // a refused insert (quota, no runner) throws here
    return { ...row };
  }

  /** A registered runner for the sandbox, in the caller's transaction; the GPU model it gets there is recorded on the row. */
  async #place(exec: Exec, row: SandboxRecord, gpuTypes: readonly string[]): Promise<string> {
    const placement = await this.runners!.place(exec, row.regionId, { ...row, gpuTypes });
    if (!placement) return this.runtime.runnerId;
    row.gpuType = placement.gpuType;
    return placement.runnerId;
  }

  /** A create served by a warm pool sandbox: its row (quota admitted), then its environment. */
  async #takeOver(row: SandboxRecord): Promise<SandboxRecord> {
    const since = this.#endpoints.generation();
    const op = this.locks.tryRunNew(row.id, async (held): Promise<Outcome> => {
      try {
        await this.store.insert({ ...row, state: "started" }, undefined, held);
      } catch (err) {
        this.pool!.giveBack(row.id);
        throw err;
      }
      try {
        await this.pool!.applyEnv(row.id, row.env);
        return {};
      } catch (err) {
        return this.#fail(row.id, err);
      }
    })!;
    const outcome = await op;
    const agent = this.pool!.agentOf(row.id);
    this.pool!.release(row.id);
    if (outcome.failed !== undefined) throw bad(`Sandbox failed to start: ${outcome.failed}`);
    // The first toolbox call finds the agent without a lookup (its warm-up found it).
    if (agent && this.runtime.agentsOnThisHost) this.#endpoints.set(row.organizationId, row.id, { sandboxId: row.id, ...agent }, since);
    this.#touched.set(row.id, Date.now()); // its row's activity stamp is this moment's
    return { ...row, state: "started" };
  }

  /**
   * A remote runner lacking the sandbox's image pulls it first, from the snapshot's registry with
   * the organization's credentials. A create reads `pulling_snapshot` meanwhile (reconcile redoes
   * the create when a crash leaves it there); a restore stays `restoring`.
   */
  async #holdImage(row: SandboxRecord, rt: SandboxRuntime): Promise<void> {
    if (!row.imageRef || !rt.pullImage || !rt.holdsImage || (await rt.holdsImage(row.imageRef))) return;
    if (!this.#imageSource) throw errors.failedPrecondition("This server cannot tell runners where snapshot images come from");
    const { name, credentials } = await this.#imageSource(row.organizationId, row.imageRef);
    const creating = (await this.#current(row.id)).state === "unknown";
    if (creating) await this.store.update(row.id, { state: "pulling_snapshot" });
    await rt.pullImage(row.imageRef, name, credentials);
    if (row.runnerId) await this.runners?.holds?.(row.runnerId, row.imageRef);
    if (creating) await this.store.update(row.id, { state: "unknown" });
  }

  /** Makes and starts the sandbox on the host; a failure leaves it in `error` with the reason. */
  async driveCreate(row: SandboxRecord): Promise<Outcome> {
    try {
      const rt = await this.runtimeOf(row);
      await this.#holdImage(row, rt);
      await rt.create(specOf(row));
      return { row: await this.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() }) };
    } catch (err) {
      return this.#fail(row.id, err);
    }
  }

  // ---- start ---------------------------------------------------------------------------------

  async start(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    if (isErrored(row.state) && !(await this.#recoverable(row))) throw bad("Sandbox is in an errored state");
    if (row.state === "started" && row.desiredState === "started" && !this.locks.busy(row.id) && !(await this.#lost(row))) return row;
    const op = this.#operate(row.id, async () => {
      const cur = await this.#current(row.id);
      const lost = await this.#lost(cur); // died since the timers last looked
      if (isErrored(cur.state) || lost) {
        if (!lost && !(await this.#recoverable(cur))) throw bad("Sandbox is in an errored state");
        // Reported `starting` meanwhile; its leftovers are torn down by the runtime's start.
        await this.store.updateAdmitted(cur, cur, { state: "stopped", desiredState: "started", authToken: newAuthToken(), errorReason: null, lastActivityAt: new Date() });
        return this.driveStart(cur);
      }
      if (cur.state === "started" && cur.desiredState === "started") return {};
      if (cur.state !== cur.desiredState) throw stateChangeInProgress();
      if (cur.state !== "stopped" && cur.state !== "archived") throw bad("Sandbox is not in valid state");
      const archived = cur.state === "archived";
      if (!archived) await this.runtimeOf(cur);
      // An archived sandbox of a region with registered runners is placed again, as a create is.
      const placed = archived && ((await this.runners?.servesRegion(cur.regionId)) ?? false);
      const patch: SandboxPatch = {
        desiredState: "started",
        authToken: newAuthToken(),
        errorReason: null,
        lastActivityAt: new Date(),
        ...(archived ? { state: "restoring", runnerId: this.runtime.runnerId } : {}),
      };
      // A stopped sandbox holds its disk already; an archived one takes it again.
      await this.store.updateAdmitted(cur, { ...cur, disk: archived ? cur.disk : 0 }, patch, { place: placed ? (exec) => this.#place(exec, cur, cur.gpuType ? [cur.gpuType] : []) : undefined });
      return archived ? this.driveRestore({ ...cur, runnerId: patch.runnerId ?? null }, this.files.archive(cur.id), "archived") : this.driveStart(cur);
    });
    return this.#answer(row.id, op, "Sandbox failed to start");
  }

  /**
   * Starts a stopped sandbox. When the host no longer has it (its files were lost), the last
   * completed backup brings it back; without one the sandbox goes to `error`.
   */
  async driveStart(row: SandboxRecord): Promise<Outcome> {
    try {
      const rt = await this.runtimeOf(row);
      if (!(await rt.inspect(row.id))) {
        if (row.backupState === "Completed" && (await this.files.exists(this.files.backup(row.id)))) {
          await this.store.update(row.id, { state: "restoring" });
          return this.driveRestore(row, this.files.backup(row.id), "error");
        }
        return this.#fail(row.id, new Error("Sandbox has no runner and backup is not completed: its files are gone from this host"));
      }
      await rt.start(row.id);
      return { row: await this.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() }) };
    } catch (err) {
      return this.#fail(row.id, err);
    }
  }

  /**
   * Restores the sandbox from a pack (archive or backup), then starts it. An archive is removed
   * only once the sandbox runs from it; if restoring fails, an archived sandbox goes back to
   * `archived` (its archive is still the whole of its files) with the reason recorded.
   */
  async driveRestore(row: SandboxRecord, pack: string, onFailure: "archived" | "error"): Promise<Outcome> {
    try {
      if (!(await this.files.exists(pack))) throw new Error(`the pack of its files (${pack}) is missing`);
      const rt = await this.runtimeOf(row);
      await rt.destroy(row.id); // whatever an interrupted restore left
      await this.#holdImage(row, rt);
      await rt.restore(specOf(row), this.files.read(pack));
      await rt.start(row.id);
      await this.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() });
      if (pack === this.files.archive(row.id)) await this.files.removeArchive(row.id);
      return {};
    } catch (err) {
      const reason = reasonOf(err);
      if (onFailure === "error") return this.#fail(row.id, err);
      this.#log(`sandbox ${row.id}: restore failed: ${reason}`);
      await this.runtimeOf(row).then((rt) => rt.destroy(row.id)).catch(() => undefined);
      await this.store.update(row.id, { state: "archived", desiredState: "archived", runnerId: null, errorReason: reason });
      return { failed: reason };
    }
  }

  // ---- stop ----------------------------------------------------------------------------------

  async stop(organizationId: string, idOrName: string, force = false): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    if (isErrored(row.state) && !(await this.#recoverable(row))) throw bad("Sandbox is in an errored state");
    const op = this.#operate(row.id, () => this.#stopChecked(row.id, force));
    return this.#answer(row.id, op, "Sandbox failed to stop");
  }

  /** Stop with the preconditions checked under the lock; `when` lets a timer re-check its reason. */
  async #stopChecked(id: string, force: boolean, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
    const cur = await this.#current(id);
    if (when && !when(cur)) return {};
    const recovering = isErrored(cur.state) && (await this.#recoverable(cur));
    if (isErrored(cur.state) && !recovering) throw bad("Sandbox is in an errored state");
    if (!recovering && cur.state !== cur.desiredState) throw stateChangeInProgress();
    if (!recovering && cur.state !== "started") throw bad("Sandbox is not in a stoppable state");
    await this.runtimeOf(cur);
    if (isEphemeral(cur.autoDeleteInterval)) {
      await this.#softDelete(cur);
      return this.driveDestroy(cur);
    }
    await this.store.update(id, { desiredState: "stopped" });
    return this.driveStop(cur, force);
  }

  async driveStop(row: SandboxRecord, force = false): Promise<Outcome> {
    try {
      await (await this.runtimeOf(row)).stop(row.id, { force });
      return { row: await this.store.update(row.id, { state: "stopped", errorReason: null, lastActivityAt: new Date() }) };
    } catch (err) {
      return this.#fail(row.id, err);
    }
  }

  // ---- archive -------------------------------------------------------------------------------

  async archive(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    if (isErrored(row.state)) throw bad("Sandbox is in an errored state");
    const op = this.#operate(row.id, () => this.#archiveChecked(row.id));
    return this.#answer(row.id, op, "Sandbox failed to archive", errors.internal);
  }

  async #archiveChecked(id: string, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
    const cur = await this.#current(id);
    if (when && !when(cur)) return {};
    if (isErrored(cur.state)) throw bad("Sandbox is in an errored state");
    if (cur.state !== cur.desiredState) throw stateChangeInProgress();
    if (cur.state !== "stopped") throw bad("Sandbox is not stopped");
    if (isEphemeral(cur.autoDeleteInterval)) throw bad("Ephemeral sandboxes cannot be archived");
    await this.runtimeOf(cur);
    await this.store.update(id, { desiredState: "archived" });
    return this.driveArchive(cur);
  }

  /** Packs the stopped sandbox's writable layer to the archive file, then frees the host. */
  async driveArchive(row: SandboxRecord): Promise<Outcome> {
    try {
      await this.#backups.get(row.id);
      const rt = await this.runtimeOf(row);
      if (await rt.inspect(row.id)) {
        await this.files.write(await rt.pack(row.id), this.files.archive(row.id));
        await rt.destroy(row.id);
      } else if (!(await this.files.exists(this.files.archive(row.id)))) {
        throw new Error("its files are gone from this host");
      }
      // No activity stamp: auto-delete keeps counting from the stop.
      await this.store.update(row.id, { state: "archived", runnerId: null, errorReason: null });
      return {};
    } catch (err) {
      // The sandbox is intact: it stays stopped; the reason is logged and answered.
      const reason = reasonOf(err);
      this.#log(`sandbox ${row.id}: archive failed: ${reason}`);
      await this.store.update(row.id, { desiredState: "stopped" });
      return { failed: reason };
    }
  }

  // ---- delete --------------------------------------------------------------------------------

  async delete(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    const op = this.#operate(row.id, () => this.#deleteChecked(row.id));
    return this.#answer(row.id, op, "Sandbox failed to delete", errors.internal);
  }

  async #deleteChecked(id: string, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
    const cur = await this.#current(id);
    if (when && !when(cur)) return {};
    if (cur.state === "destroyed" || (cur.desiredState === "destroyed" && isErrored(cur.state))) {
      throw errors.notFound(`Sandbox with ID or name ${id} not found`);
    }
    await this.runtimeOf(cur);
    await this.#softDelete(cur);
    return this.driveDestroy(cur);
  }

  /** The reference's soft delete: desired `destroyed`, the name freed, no backup any more. */
  async #softDelete(row: SandboxRecord): Promise<void> {
    const name = row.name.startsWith("DESTROYED_") ? row.name : `DESTROYED_${row.name}_${Date.now()}`;
    await this.store.update(row.id, { desiredState: "destroyed", name, backupState: "None" });
  }

  /** Removes the sandbox from the host and its packs from disk; a failure is retried by the timers. */
  async driveDestroy(row: SandboxRecord): Promise<Outcome> {
    try {
      await this.#backups.get(row.id);
      await (await this.runtimeOf(row)).destroy(row.id);
      await this.files.remove(row.id);
      await this.store.update(row.id, { state: "destroyed", runnerId: null, errorReason: null });
      this.#touched.delete(row.id);
      return {};
    } catch (err) {
      return this.#fail(row.id, err);
    }
  }

  // ---- backup --------------------------------------------------------------------------------

  async backup(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    this.#assertOpen();
    const row = await this.store.find(organizationId, idOrName);
    if (isEphemeral(row.autoDeleteInterval)) throw bad("Ephemeral sandboxes cannot be backed up");
    if (row.backupState === "Pending" || row.backupState === "InProgress") throw bad("Sandbox backup is already in progress");
    if (this.locks.busy(row.id) || row.state !== row.desiredState) throw stateChangeInProgress();
    if (row.state !== "started" && row.state !== "stopped") throw bad("Sandbox is not in valid state");
    const rt = await this.runtimeOf(row);
    const claimed = await this.store.updateIf(row.id, { backupState: { $in: ["None", "Completed", "Error"] } }, { backupState: "InProgress" });
    if (!claimed) throw bad("Sandbox backup is already in progress");
    const id = row.id;
    const work = (async () => {
      try {
        await this.files.write(await rt.pack(id), this.files.backup(id));
        await this.store.updateIf(id, { backupState: "InProgress" }, { backupState: "Completed", backupCreatedAt: new Date() });
      } catch (err) {
        this.#log(`sandbox ${id}: backup failed: ${reasonOf(err)}`);
        await this.store.updateIf(id, { backupState: "InProgress" }, { backupState: "Error" }).catch(() => undefined);
      }
    })().finally(() => this.#backups.delete(id));
    this.#backups.set(id, work);
    this.touch(id);
    return this.#current(id);
  }

  // ---- resize --------------------------------------------------------------------------------

  /** cpu, memory (GiB) and disk (GiB) as asked; absent fields stay (checked by the service: each ≥ 1). */
  async resize(organizationId: string, idOrName: string, want: Partial<Resources>): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    const op = this.#operate(row.id, () => this.#resizeChecked(row.id, want));
    return this.#answer(row.id, op, "Sandbox failed to resize");
  }

  /** The reference's rules in its order, then the quota (reserved with the new size), then the host. */
  async #resizeChecked(id: string, want: Partial<Resources>): Promise<Outcome> {
    const cur = await this.#current(id);
    if (cur.state !== "started" && cur.state !== "stopped") throw bad("Sandbox must be in started or stopped state to resize");
    if (cur.state !== cur.desiredState) throw stateChangeInProgress();
    const next: Resources = { cpu: want.cpu ?? cur.cpu, memory: want.memory ?? cur.memory, disk: want.disk ?? cur.disk };
    if (next.cpu === cur.cpu && next.memory === cur.memory && next.disk === cur.disk) {
      throw bad("No resource changes specified - sandbox is already at the desired configuration");
    }
    const running = cur.state === "started";
    if (running && next.disk !== cur.disk) throw bad("Disk resize can only be performed on a stopped sandbox");
    if (running && next.cpu < cur.cpu) throw bad("Sandbox must be in stopped state to decrease the number of CPU cores");
    if (running && next.memory < cur.memory) throw bad("Sandbox must be in stopped state to decrease memory");
    if (next.disk < cur.disk) throw bad("Sandbox disk size cannot be decreased");
    if (cur.runnerId === null) throw bad("Sandbox has no runner assigned");
    await this.runtimeOf(cur);
    // The totals take what the resize adds (cpu and memory count only while the sandbox runs); the
    // per-sandbox limits its new size. The new size is written with `resizing`, so the room it
    // needs is held against concurrent creates and starts, and given back if the host fails.
    const added = { cpu: running ? next.cpu - cur.cpu : 0, memory: running ? next.memory - cur.memory : 0, disk: next.disk - cur.disk, gpu: 0, sandboxClass: cur.sandboxClass };
    await this.store.updateAdmitted(cur, added, { state: "resizing", ...next }, { size: { ...next, gpu: cur.gpu } });
    return this.driveResize({ ...cur, ...next, state: "resizing" }, cur);
  }

  /**
   * Applies the row's resources on the host, then puts the sandbox back in the state it was in
   * (`desiredState`: a resize never changes it). On failure the old resources come back when they
   * are known (`before`); after a crash they are not, and the sandbox goes to `error`.
   */
  async driveResize(row: SandboxRecord, before?: Resources): Promise<Outcome> {
    const back = row.desiredState === "started" ? "started" : "stopped";
    try {
      await (await this.runtimeOf(row)).resize(row.id, { cpu: row.cpu, memoryGiB: row.memory, diskGiB: row.disk });
      await this.store.update(row.id, { state: back });
      this.touch(row.id);
      return {};
    } catch (err) {
      if (!before) return this.#fail(row.id, err);
      const reason = reasonOf(err);
      this.#log(`sandbox ${row.id}: resize failed: ${reason}`);
      await this.store.update(row.id, { state: back, cpu: before.cpu, memory: before.memory, disk: before.disk });
      return { failed: reason };
    }
  }

  // ---- attributes ----------------------------------------------------------------------------

  /**
   * A new network policy, pushed to the host first (at once for a sandbox running with egress; one
   * started loopback-only gets it at its next start), then persisted, as the reference does.
   */
  async setNetwork(organizationId: string, idOrName: string, next: (current: NetworkFields) => NetworkFields): Promise<SandboxRecord> {
    this.#assertOpen();
    const row = await this.store.find(organizationId, idOrName);
    const fields = next(row);
    const op = this.locks.tryRun(row.id, async () => {
      const rt = row.runnerId === null ? undefined : await this.runtimeOf(row);
      if (rt && (await rt.inspect(row.id))) await rt.setNetwork(row.id, runtimeNetwork(fields));
      await this.store.update(row.id, { networkBlockAll: fields.networkBlockAll, networkAllowList: fields.networkAllowList ?? null });
    });
    if (!op) throw stateChangeInProgress();
    await op;
    this.touch(row.id);
    return this.#current(row.id);
  }

  async update(organizationId: string, idOrName: string, patch: SandboxPatch): Promise<SandboxRecord> {
    const row = await this.store.find(organizationId, idOrName);
    await this.store.update(row.id, patch);
    this.touch(row.id);
    return this.#current(row.id);
  }

  // ---- timers --------------------------------------------------------------------------------

  /** The timers' operations: skipped when busy; `when` is re-checked under the lock. */
  autoStop(id: string, when: (row: SandboxRecord) => boolean): Promise<Outcome> | undefined {
    return this.#timerOp(id, () => this.#stopChecked(id, false, when));
  }

  autoArchive(id: string, when: (row: SandboxRecord) => boolean): Promise<Outcome> | undefined {
    return this.#timerOp(id, () => this.#archiveChecked(id, when));
  }

  autoDelete(id: string, when: (row: SandboxRecord) => boolean): Promise<Outcome> | undefined {
    return this.#timerOp(id, () => this.#deleteChecked(id, when));
  }

  /** Finishes a delete that failed on the host (the row is `error` with desired `destroyed`). */
  retryDestroy(id: string): Promise<Outcome> | undefined {
    return this.#timerOp(id, async () => {
      const cur = await this.#current(id);
      if (cur.desiredState !== "destroyed" || cur.state === "destroyed") return {};
      return this.driveDestroy(cur);
    });
  }

  /** A started sandbox whose first process is gone (an OOM kill, a crash) is reported as `error`. */
  markLost(id: string, reason: string): Promise<Outcome> | undefined {
    return this.#timerOp(id, async () => {
      const cur = await this.#current(id);
      if (cur.state !== "started" || cur.desiredState !== "started") return {};
      const rt = await (await this.runtimeOf(cur)).inspect(id);
      if (rt?.state === "started") return {};
      return this.#fail(id, new Error(rt?.error ?? reason));
    });
  }

  /**
   * An `error` the user can leave with start (or stop): the sandbox was running here and its
   * first process died (an OOM kill, its agent's supervisor giving up, a crash); its files are
   * intact on this host. Other errors (a create or start that failed, files lost, a failed
   * restore or delete) keep the reference's 400 "Sandbox is in an errored state".
   */
  async #recoverable(row: SandboxRecord): Promise<boolean> {
    if (row.state !== "error" || row.desiredState !== "started" || row.runnerId === null) return false;
    return (await this.runtimeOf(row).then((rt) => rt.inspect(row.id)).catch(() => undefined))?.state === "error";
  }

  /** Started here, but its first process is gone (not yet marked `error` by the timers). */
  async #lost(row: SandboxRecord): Promise<boolean> {
    if (row.state !== "started" || row.desiredState !== "started" || row.runnerId === null) return false;
    return (await this.runtimeOf(row).then((rt) => rt.inspect(row.id)).catch(() => undefined))?.state === "error";
  }

  #timerOp(id: string, fn: () => Promise<Outcome>): Promise<Outcome> | undefined {
    if (this.#closing) return undefined;
    const op = this.locks.tryRun(id, fn);
    op?.catch(() => undefined);
    return op;
  }

  // ---- shutdown ------------------------------------------------------------------------------

  /** Refuses new operations and waits (up to `timeoutMs`) for those running. */
  async close(timeoutMs = 30_000): Promise<void> {
    this.#closing = true;
    await Promise.race([
      Promise.allSettled([this.locks.idle(timeoutMs), ...this.#backups.values()]),
      new Promise((r) => setTimeout(r, timeoutMs).unref()),
    ]);
  }

  // ---- helpers -------------------------------------------------------------------------------

  #assertOpen(): void {
    if (this.#closing) throw errors.unavailable("The server is shutting down");
  }

  /** The runtime of the runner holding the sandboxes (this server's when it holds none, or it is this server's). */
  async runtimeOf(row: Pick<SandboxRecord, "id" | "runnerId">): Promise<SandboxRuntime> {
    if (!row.runnerId || row.runnerId === this.runtime.runnerId) return this.runtime;
    const rt = await this.runners?.runtime(row.runnerId);
    if (!rt) throw errors.unavailable(`Sandbox ${row.id} is held by runner ${row.runnerId}, which this server does not run`);
    return rt;
  }

  #operate(id: string, fn: () => Promise<Outcome>): Promise<Outcome> {
    this.#assertOpen();
    const op = this.locks.tryRun(id, fn);
    if (!op) throw stateChangeInProgress();
    return op;
  }

  async #current(id: string): Promise<SandboxRecord> {
    const row = await this.store.byId(id);
    if (!row) throw errors.notFound(`Sandbox with ID or name ${id} not found`);
    return row;
  }

  /**
   * Waits for the operation up to waitMs. A precondition it refused is thrown; a failure it
   * recorded is answered as `<what>: <reason>`; past the wait, the sandbox as it is now.
   */
  async #answer(id: string, op: Promise<Outcome>, what: string, make: (m: string) => ConnectError = bad): Promise<SandboxRecord> {
    op.catch(() => undefined); // a failure after the wait is recorded on the sandbox, not lost
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([op, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), this.#waitMs)))]).finally(() => clearTimeout(timer));
    if (outcome?.failed !== undefined) throw make(`${what}: ${outcome.failed}`);
    return outcome?.row ?? this.#current(id);
  }

  /** Records the failure on the sandbox (state `error`) and reports it to the waiting caller. */
  async #fail(id: string, err: unknown): Promise<Outcome> {
    const reason = reasonOf(err);
    this.#log(`sandbox ${id}: ${reason}`);
    await this.store.update(id, { state: "error", errorReason: reason });
    return { failed: reason };
  }
}

export function specOf(row: SandboxRecord): RuntimeSandboxSpec {
  const spec: RuntimeSandboxSpec = { id: row.id, cpu: row.cpu, memoryGiB: row.memory, diskGiB: row.disk, env: row.env, user: row.osUser, volumes: row.volumes ?? [], network: runtimeNetwork(row) };
  if (row.imageRef) spec.image = row.imageRef;
  return spec;
}

function reasonOf(err: unknown): string {
  if (err instanceof ConnectError) return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}
