import { randomUUID } from "node:crypto";
import type { SandboxRecord, SandboxVolumeMount } from "../db/entities.ts";
import type { Exec } from "../db/exec.ts";
import { readyForCalls } from "./agent-endpoints.ts";
import { newAuthToken } from "./auth-token.ts";
import { runtimeNetwork } from "./network-policy.ts";
import { bad, type OperationContext, type Outcome, reasonOf } from "./operation-context.ts";
import { holdImage, place } from "./placement.ts";
import type { RuntimeSandboxSpec, SandboxRuntime } from "./runtime.ts";
import { fitsInProcess, noAvailableRunners } from "./sandbox-class.ts";
import type { WarmPool } from "./warm-pool.ts";

// Creating a sandbox: from a snapshot (or a warm pool sandbox of its shape), or from a
// declarative build; then making it on its runner (driveCreate, which reconcile.ts redoes when
// a crash cut a create short).

/** A validated create request. */
export interface NewSandbox {
  organizationId: string;
  regionId: string;
  name?: string;
  snapshot: string;
  /** The snapshot's image (manifest digest); absent for the default snapshot. */
  imageRef?: string;
  /** A running sandbox's snapshot: its captured layers above the image, top first (runner-local). */
  layers?: string[];
  /** The runner holding `layers`: the sandbox is made there. */
  layersRunnerId?: string;
  /** The manifest digest `layers` were exported as (snapshot-travel.ts): what a create that cannot use them pulls. */
  layersImage?: string;
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
  /** Minutes; 0 disables. */
  autoPauseInterval?: number;
  autoArchiveInterval: number;
  autoDeleteInterval: number;
  /** Volumes to mount, resolved (volumes/sandbox-mounts.ts). */
  volumes: SandboxVolumeMount[];
  networkBlockAll: boolean;
  networkAllowList: string | null;
}

export async function create(c: OperationContext, given: NewSandbox): Promise<SandboxRecord> {
  c.assertOpen();
  const input = await layersOrImage(c, given);
  // Pool sandboxes are loopback only, without volumes, on this server's runtime: any other create is made for its request.
  // Layers are where they were captured: such a sandbox is made on that runner, not placed.
  const pinned = input.layersRunnerId !== undefined && input.layersRunnerId !== c.runtime.runnerId ? input.layersRunnerId : undefined;
  const placed = !input.layersRunnerId && ((await c.runners?.servesRegion(input.regionId)) ?? false);
  // This server's own runtime is a container runner without GPUs (the pool's sandboxes too).
  const inProcess = !pinned && fitsInProcess(input);
  const warm = !placed && inProcess && input.volumes.length === 0 && input.networkBlockAll && !input.networkAllowList ? c.pools?.claim(input) : undefined;
  if (!warm && !placed && inProcess) await c.runtime.assertReady();
  const id = warm?.id ?? randomUUID();
  const row = newRow(c, input, id, { snapshot: input.snapshot, state: "unknown", imageRef: input.imageRef ?? null, buildInfo: null });
  if (pinned) row.runnerId = pinned;
  if (warm) return takeOver(c, { ...row, warmPoolId: warm.poolId ?? null }, warm.pool);
  const op = c.locks.tryRunNew(id, async (held) => {
    // A region with registered runners: one is picked in the insert's transaction (placement.ts).
    // What this server's runtime cannot take is refused where placement would be: after the quota (the reference's order).
    const placeIt = placed ? (exec: Exec) => place(c, exec, row, input.gpuTypes) : inProcess || pinned ? undefined : () => Promise.reject(noAvailableRunners(input.gpuTypes));
    await c.store.insert(row, placeIt, held);
    return driveCreate(c, row);
  })!;
  const made = await c.answer(id, op, "Sandbox failed to start");
  if (made.state === "started" && made.desiredState === "started") readyForCalls(c, made);
  return made;
}

/**
 * A running sandbox's snapshot exported as an image (snapshot-travel.ts) is made from its layers
 * where they are, and from the image where they cannot serve: their runner gone, not answering or
 * without them any more, or (layers on this server's runtime) a region of registered runners. The
 * image is then an ordinary image snapshot's: placed, pulled by the runner (placement.ts).
 */
async function layersOrImage(c: OperationContext, input: NewSandbox): Promise<NewSandbox> {
  if (!input.layers?.length || !input.layersImage || (await layersUsable(c, input))) return input;
  c.log(`snapshot ${input.snapshot}: its layers cannot serve this create on runner ${input.layersRunnerId}: from its image ${input.layersImage}`);
  return { ...input, imageRef: input.layersImage, layers: undefined, layersRunnerId: undefined, layersImage: undefined };
}

async function layersUsable(c: OperationContext, input: NewSandbox): Promise<boolean> {
  const runnerId = input.layersRunnerId;
  const holds = async (rt: SandboxRuntime) => {
    const have = new Set((await rt.listLayers()).map((l) => l.id));
    return input.layers!.every((l) => have.has(l));
  };
  try {
    if (!runnerId || runnerId === c.runtime.runnerId) return !((await c.runners?.servesRegion(input.regionId)) ?? false) && (await holds(c.runtime));
    if (!((await c.runners?.ready()) ?? []).includes(runnerId)) return false;
    const rt = await c.runners?.runtime(runnerId);
    return rt !== undefined && (await holds(rt));
  } catch (err) {
    c.log(`snapshot ${input.snapshot}: runner ${runnerId} cannot say whether it holds the layers: ${reasonOf(err)}`);
    return false;
  }
}

/**
 * A create from a declarative build (reference: pending_build -> building_snapshot -> creating
 * -> started, or build_failed): the row is admitted (quota), then answered at once in
 * pending_build, as the reference answers (clients poll, and follow the build logs while it
 * builds); in the background `build` makes the image (its manifest digest) and the sandbox is
 * created from it.
 */
export async function createFromBuild(c: OperationContext, input: NewSandbox, buildInfo: NonNullable<SandboxRecord["buildInfo"]>, build: (id: string, runnerId: string) => Promise<string>): Promise<SandboxRecord> {
  c.assertOpen();
  // A region with registered runners: the sandbox is placed at once, and built on its runner.
  const placed = (await c.runners?.servesRegion(input.regionId)) ?? false;
  if (!placed) {
    if (!fitsInProcess(input)) throw noAvailableRunners(input.gpuTypes); // this server's runtime: a container runner without GPUs
    await c.runtime.assertReady();
  }
  const id = randomUUID();
  const row = newRow(c, input, id, { snapshot: null, state: "pending_build", imageRef: null, buildInfo });
  let admitted!: () => void;
  const inserted = new Promise<void>((resolve) => (admitted = resolve));
  const op = c.locks.tryRun(id, async (): Promise<Outcome> => {
    await c.store.insert(row, placed ? (exec: Exec) => place(c, exec, row, input.gpuTypes) : undefined);
    admitted();
    let imageRef: string;
    try {
      await c.store.update(id, { state: "building_snapshot" });
      imageRef = await build(id, row.runnerId ?? c.runtime.runnerId);
    } catch (err) {
      const reason = reasonOf(err);
      await c.store.update(id, { state: "build_failed", errorReason: reason });
      return { failed: reason };
    }
    await c.store.update(id, { state: "unknown", imageRef }); // reported as creating
    return driveCreate(c, { ...row, imageRef });
  })!;
  op.catch(() => undefined); // after the insert, failures are recorded on the sandbox
  await Promise.race([inserted, op]); // a refused insert (quota, no runner) throws here
  return { ...row };
}

/** Makes and starts the sandbox on the host; a failure leaves it in `error` with the reason. */
export async function driveCreate(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  try {
    const rt = await c.runtimeOf(row);
    await holdImage(c, row, rt);
    await rt.create(specOf(row));
    return { row: await c.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() }) };
  } catch (err) {
    return c.fail(row.id, err);
  }
}

/** What the runtime is told to make (or restore) for the sandbox. */
export function specOf(row: SandboxRecord): RuntimeSandboxSpec {
  const spec: RuntimeSandboxSpec = { id: row.id, cpu: row.cpu, memoryGiB: row.memory, diskGiB: row.disk, env: row.env, user: row.osUser, volumes: row.volumes ?? [], network: runtimeNetwork(row) };
  if (row.imageRef) spec.image = row.imageRef;
  if (row.layers?.length) spec.layers = row.layers;
  return spec;
}

/** The new sandbox's row: the request's fields, desired `started`, a fresh preview token; `origin` is what differs between a create and a build. */
function newRow(c: OperationContext, input: NewSandbox, id: string, origin: Pick<SandboxRecord, "snapshot" | "state" | "imageRef" | "buildInfo">): SandboxRecord {
  const now = new Date();
  return {
    id,
    organizationId: input.organizationId,
    name: input.name ?? id,
    snapshot: origin.snapshot,
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
    state: origin.state,
    desiredState: "started",
    errorReason: null,
    backupState: "None",
    backupCreatedAt: null,
    autoStopInterval: input.autoStopInterval,
    autoPauseInterval: input.autoPauseInterval ?? 0,
    autoArchiveInterval: input.autoArchiveInterval,
    autoDeleteInterval: input.autoDeleteInterval,
    createdAt: now,
    updatedAt: now,
    lastActivityAt: now,
    authToken: newAuthToken(),
    regionId: input.regionId,
    runnerId: c.runtime.runnerId,
    volumes: input.volumes,
    imageRef: origin.imageRef,
    networkBlockAll: input.networkBlockAll,
    networkAllowList: input.networkAllowList,
    buildInfo: origin.buildInfo,
    warmPoolId: null,
    autoDestroyAt: null,
    recoverable: false,
    signingKeySealed: null,
    layers: input.layers?.length ? input.layers : null,
    parentId: null,
  };
}

/** A create served by a warm pool sandbox: its row (quota admitted), then its environment. */
async function takeOver(c: OperationContext, row: SandboxRecord, pool: WarmPool): Promise<SandboxRecord> {
  const since = c.endpoints.generation();
  const op = c.locks.tryRunNew(row.id, async (held): Promise<Outcome> => {
    try {
      await c.store.insert({ ...row, state: "started" }, undefined, held);
    } catch (err) {
      pool.giveBack(row.id);
      throw err;
    }
    try {
      await pool.takeOver(row.id, row.env);
      return {};
    } catch (err) {
      return c.fail(row.id, err);
    }
  })!;
  const outcome = await op;
  const agent = pool.agentOf(row.id);
  pool.release(row.id);
  if (outcome.failed !== undefined) throw bad(`Sandbox failed to start: ${outcome.failed}`);
  // The first toolbox call finds the agent without a lookup (its warm-up found it).
  if (agent && c.runtime.agentsOnThisHost) c.endpoints.set(row.organizationId, row.id, { sandboxId: row.id, ...agent }, since);
  c.activity.stamped(row.id); // its row's activity stamp is this moment's
  return { ...row, state: "started" };
}
