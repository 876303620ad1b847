import type { MikroORM } from "@mikro-orm/postgresql";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import { ActivityStamps } from "./activity.ts";
import type { SharedLocks } from "./cluster-locks.ts";
import { EndpointCache } from "./endpoint-cache.ts";
import { LayerFiles } from "./layer-files.ts";
import { OperationLocks } from "./operation-locks.ts";
import type { ImageSource, RunnerDirectory } from "./runner-directory.ts";
import type { RegistryCredentials } from "@sandbar/runner/images";
import type { SandboxRuntime } from "./runtime.ts";
import { SandboxStore } from "./store.ts";
import type { WarmPools } from "./warm-pools.ts";

// What every sandbox operation shares: its dependencies, and how an operation runs (reference
// §4.3). One operation at a time per sandbox; an operation records where it is going
// (desiredState) before it works and where the sandbox is (state) after, so a crash in between
// is visible and reconcile.ts can finish the job. API calls wait for their operation up to
// `waitMs` (30 s, like the reference's create and start), then answer the state as it is.

export interface SandboxManagerOptions {
  orm: MikroORM;
  runtime: SandboxRuntime;
  /** The server's data dir: archives/ and backups/ go there. */
  dataDir: string;
  /** Length of a timer "minute" (activity stamps are throttled to a sixth of it, at most 10 s). */
  minuteMs?: number;
  waitMs?: number;
  log?: (line: string) => void;
  /** Started sandboxes that creates of their snapshot and shape take over. */
  pools?: WarmPools;
  /** The registered runners (runners/directory.ts): regions that have some place their sandboxes there. */
  runners?: RunnerDirectory;
  /** Where a runner pulls a snapshot's image from: its pinned name and the organization's credentials for it. */
  imageSource?: ImageSource;
  /** Where a running sandbox's snapshot is exported as an image (the internal registry); absent: such snapshots stay on their runner. */
  snapshotPush?: SnapshotPush;
  /** Locks shared by every control process of the database (cluster-locks.ts): one operation per sandbox among them all. */
  sharedLocks?: SharedLocks;
}

/**
 * How an operation ended: `failed` carries the reason when the sandbox did not get there; `row`,
 * the sandbox as its last write committed it (the answer, without reading it again).
 */
/** The repository a snapshot of the organization is pushed to, with credentials that may push there. */
export type SnapshotPush = (organizationId: string, snapshotId: string) => Promise<{ image: string; credentials?: RegistryCredentials }>;

export interface Outcome {
  failed?: string;
  row?: SandboxRecord;
}

export const stateChangeInProgress = () => new ConnectError("Sandbox state change in progress", Code.Aborted);
export const bad = (message: string) => errors.invalidArgument(message);

export function reasonOf(err: unknown): string {
  if (err instanceof ConnectError) return err.rawMessage;
  return err instanceof Error ? err.message : String(err);
}

export class OperationContext {
  readonly runtime: SandboxRuntime;
  readonly runners?: RunnerDirectory;
  readonly imageSource?: ImageSource;
  readonly snapshotPush?: SnapshotPush;
  /** Exports of snapshots to the registry under way (snapshot-travel.ts). */
  readonly exports = new Set<Promise<void>>();
  readonly store: SandboxStore;
  readonly files: LayerFiles;
  readonly locks: OperationLocks;
  readonly pools: WarmPools | undefined;
  readonly log: (line: string) => void;
  readonly activity: ActivityStamps;
  /** The toolbox's agent lookups (agent-endpoints.ts); every write to a row evicts its sandbox's. */
  readonly endpoints = new EndpointCache();
  /** Backups being written (backup.ts): archive and destroy wait for the sandbox's. */
  readonly backups = new Map<string, Promise<void>>();
  readonly #waitMs: number;
  #closing = false;

  constructor(o: SandboxManagerOptions) {
    this.runtime = o.runtime;
    this.store = new SandboxStore(o.orm);
    this.store.onWrite = (id) => this.endpoints.evict(id);
    this.files = new LayerFiles(o.dataDir);
    this.log = o.log ?? (() => undefined);
    this.activity = new ActivityStamps(this.store, Math.min(10_000, Math.floor((o.minuteMs ?? 60_000) / 6)), this.log);
    this.#waitMs = o.waitMs ?? 30_000;
    this.pools = o.pools;
    this.runners = o.runners;
    this.imageSource = o.imageSource;
    this.snapshotPush = o.snapshotPush;
    this.locks = new OperationLocks(o.sharedLocks);
  }

  /** Set by close(): no new operation starts. */
  get closing(): boolean {
    return this.#closing;
  }

  /** Refuses new operations and waits (up to `timeoutMs`) for those running. */
  async close(timeoutMs = 30_000): Promise<void> {
    this.#closing = true;
    await Promise.race([
      Promise.allSettled([this.locks.idle(timeoutMs), ...this.backups.values(), ...this.exports]),
      new Promise((r) => setTimeout(r, timeoutMs).unref()),
    ]);
  }

  assertOpen(): void {
    if (this.#closing) throw errors.unavailable("The server is shutting down");
  }

  /** The runtime of the runner holding the sandboxes (this server's when it holds none, or it is this server's). */
  async runtimeOf(row: Pick<SandboxRecord, "id" | "runnerId">): Promise<SandboxRuntime> {
    if (!row.runnerId || row.runnerId === this.runtime.runnerId) return this.runtime;
    const rt = await this.runners?.runtime(row.runnerId);
    if (!rt) throw errors.unavailable(`Sandbox ${row.id} is held by runner ${row.runnerId}, which this server does not run`);
    return rt;
  }

  /** Runs `fn` holding the sandbox's lock; a state change in progress when another operation holds it. */
  operate(id: string, fn: () => Promise<Outcome>): Promise<Outcome> {
    this.assertOpen();
    const op = this.locks.tryRun(id, fn);
    if (!op) throw stateChangeInProgress();
    return op;
  }

  async current(id: string): Promise<SandboxRecord> {
    const row = await this.store.byId(id);
    if (!row) throw errors.notFound(`Sandbox with ID or name ${id} not found`);
    return row;
  }

  /**
   * Waits for the operation up to waitMs. A precondition it refused is thrown; a failure it
   * recorded is answered as `<what>: <reason>`; past the wait, the sandbox as it is now.
   */
  async answer(id: string, op: Promise<Outcome>, what: string, make: (m: string) => ConnectError = bad): Promise<SandboxRecord> {
    op.catch(() => undefined); // a failure after the wait is recorded on the sandbox, not lost
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([op, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), this.#waitMs)))]).finally(() => clearTimeout(timer));
    if (outcome?.failed !== undefined) throw make(`${what}: ${outcome.failed}`);
    return outcome?.row ?? this.current(id);
  }

  /**
   * Records the failure on the sandbox (state `error`) and reports it to the waiting caller.
   * `recoverable`: its files are intact on its host and recover (or start) brings it back.
   */
  async fail(id: string, err: unknown, recoverable = false): Promise<Outcome> {
    const reason = reasonOf(err);
    this.log(`sandbox ${id}: ${reason}`);
    await this.store.update(id, { state: "error", errorReason: reason, recoverable });
    return { failed: reason };
  }
}
