import { randomUUID } from "node:crypto";
import { MAX_LAYERS } from "@sandbar/runner";
import type { SandboxRecord } from "../db/entities.ts";
import type { OperationContext } from "./operation-context.ts";
import type { SandboxRuntime } from "./runtime.ts";

// What a snapshot of a running sandbox and a fork share (DESIGN.md decision 19): the sandbox's
// writable layer captured on its runner as a new read-only layer, on top of the layers it already
// stands on. Past MAX_LAYERS the stack is squashed into one layer at the capture, so mounts and
// lookups stay bounded. The ids are chosen before the work, so the rows that will name them are
// written first (a quota refusal or a duplicate name costs no copy) and a sweep never takes a
// layer some row is about to name.

export interface CapturePlan {
  /** The new layer of the sandbox's writable layer. */
  top: string;
  /** The stack it goes on: the new layer, then the sandbox's own, top first. */
  stack: string[];
  /** What sandboxes and snapshots made from the capture stand on: `stack`, or its squash. */
  layers: string[];
}

/** Layer ids are sandbox-like names on the runner: letters and digits, at most 63. */
const newLayerId = () => `l${randomUUID().replaceAll("-", "")}`;

export function planCapture(row: Pick<SandboxRecord, "layers">): CapturePlan {
  const top = newLayerId();
  const stack = [top, ...(row.layers ?? [])];
  return { top, stack, layers: stack.length > MAX_LAYERS ? [newLayerId()] : stack };
}

/** Captures the sandbox's writable layer (the runner freezes it for that instant while it runs), then squashes a stack past the bound. */
export async function capture(rt: SandboxRuntime, id: string, plan: CapturePlan): Promise<void> {
  await rt.captureLayer(id, plan.top);
  if (plan.layers[0] !== plan.top) await rt.squashLayers(plan.stack, plan.layers[0]!);
}

/** Layers younger than this are never swept: a capture's rows may not name them yet. */
const SWEEP_GRACE_MS = 10 * 60_000;

/**
 * Removes from the runtime's host the captured layers no sandbox (not destroyed) and no snapshot
 * names any more: run after a delete of a sandbox or snapshot that had some, and by reconcile.
 */
export async function sweepLayers(c: OperationContext, rt: SandboxRuntime, graceMs = SWEEP_GRACE_MS): Promise<string[]> {
  const held = await rt.listLayers();
  if (held.length === 0) return [];
  const used = await c.store.layersInUse();
  const gone = held.filter((l) => !used.has(l.id) && Date.now() - l.createdAt.getTime() >= graceMs).map((l) => l.id);
  if (gone.length > 0) await rt.removeLayers(gone);
  return gone;
}
