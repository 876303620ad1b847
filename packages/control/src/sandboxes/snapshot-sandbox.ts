import type { SandboxRecord } from "../db/entities.ts";
import { checkSnapshotName } from "../snapshots/names.ts";
import type { NewSnapshot, SnapshotPatch, SnapshotRow, SnapshotStateName } from "../snapshots/store.ts";
import { Checks } from "../services/validate.ts";
import { DEFAULT_SNAPSHOT } from "./create-request.ts";
import { capture, planCapture } from "./layer-capture.ts";
import { exportInBackground } from "./snapshot-travel.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";

// A snapshot of a running (or stopped) sandbox (0.218 `createSnapshot`): its writable layer is
// captured over the layers it stands on, and the stack (with its image) becomes a snapshot of the
// organization, active at once and usable by creates on the runner holding the layers. The
// snapshot's row is written first (its name checked, its quota admitted), `pending` until the
// capture is done; the sandbox reads `snapshotting` meanwhile and goes back to its state.

/** What the operation needs of the snapshot table (snapshots/store.ts). */
export interface LayerSnapshots {
  insert(s: NewSnapshot): Promise<SnapshotRow>;
  update(id: string, patch: SnapshotPatch, from?: SnapshotStateName[]): Promise<SnapshotRow | undefined>;
  remove(id: string): Promise<void>;
}

export interface SnapshotOfSandbox {
  name: string;
  includeMemory?: boolean;
}

/** A sandbox a snapshot or a fork may capture: started or stopped, with no state change under way. */
export function checkCapturable(row: SandboxRecord, what: "snapshot" | "fork"): void {
  if (row.state !== row.desiredState) throw stateChangeInProgress();
  if (row.state !== "started" && row.state !== "stopped") throw bad(`Sandbox must be started or stopped to ${what === "snapshot" ? "create a snapshot" : "be forked"}`);
}

export async function snapshotSandbox(c: OperationContext, snapshots: LayerSnapshots, organizationId: string, idOrName: string, req: SnapshotOfSandbox): Promise<SandboxRecord> {
  c.assertOpen();
  checkSnapshotName(new Checks(), req.name).done();
  if (req.includeMemory) throw bad("Container sandboxes do not support memory snapshots");
  const row = await c.store.find(organizationId, idOrName);
  if (c.locks.busy(row.id)) throw stateChangeInProgress();
  checkCapturable(row, "snapshot");
  const op = c.operate(row.id, async (): Promise<Outcome> => {
    const cur = await c.current(row.id);
    checkCapturable(cur, "snapshot");
    const rt = await c.runtimeOf(cur);
    const plan = planCapture(cur);
    // Name and quota first: a refusal costs no copy. The image is the sandbox's (none: the default snapshot).
    const snap = await snapshots.insert({
      organizationId, name: req.name, imageName: cur.snapshot ?? DEFAULT_SNAPSHOT, entrypoint: [], cpu: cur.cpu, gpu: cur.gpu, mem: cur.memory, disk: cur.disk,
      layers: { ids: plan.layers, runnerId: rt.runnerId, ref: cur.imageRef ?? null, sandboxId: cur.id },
    });
    await c.store.update(cur.id, { state: "snapshotting" });
    try {
      await capture(rt, cur.id, plan);
      await snapshots.update(snap.id, { state: "active" }, ["pending"]);
      // Not awaited: the answer does not wait for the push.
      exportInBackground(c, snapshots, rt, { snapshot: snap, organizationId, layers: plan.layers, ref: cur.imageRef ?? null, user: cur.osUser });
    } catch (err) {
      c.log(`sandbox ${cur.id}: snapshot ${req.name} failed: ${reasonOf(err)}`);
      await snapshots.remove(snap.id).catch(() => undefined);
      await c.store.update(cur.id, { state: cur.state });
      return { failed: reasonOf(err) };
    }
    c.activity.touch(cur.id);
    return { row: await c.store.update(cur.id, { state: cur.state }) };
  });
  return c.answer(row.id, op, "Sandbox snapshot failed");
}
