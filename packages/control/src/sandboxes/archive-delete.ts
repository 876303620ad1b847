import { errors } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import { sweepLayers } from "./layer-capture.ts";
import { isEphemeral, isErrored } from "./states.ts";

// Archive (a stopped sandbox's files packed off the host) and delete, with the reference's
// preconditions; driveArchive and driveDestroy do the host's part and are what reconcile.ts
// redoes after a crash (and the timers after a failed destroy).

export async function archive(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  if (isErrored(row.state)) throw bad("Sandbox is in an errored state");
  const op = c.operate(row.id, () => archiveChecked(c, row.id));
  return c.answer(row.id, op, "Sandbox failed to archive", errors.internal);
}

/** Archive with the preconditions checked under the lock; `when` lets a timer re-check its reason. */
export async function archiveChecked(c: OperationContext, id: string, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
  const cur = await c.current(id);
  if (when && !when(cur)) return {};
  if (isErrored(cur.state)) throw bad("Sandbox is in an errored state");
  if (cur.state !== cur.desiredState) throw stateChangeInProgress();
  if (cur.state !== "stopped") throw bad("Sandbox is not stopped");
  if (isEphemeral(cur.autoDeleteInterval)) throw bad("Ephemeral sandboxes cannot be archived");
  await c.runtimeOf(cur);
  await c.store.update(id, { desiredState: "archived" });
  return driveArchive(c, cur);
}

/** Packs the stopped sandbox's writable layer to the archive file, then frees the host. */
export async function driveArchive(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  try {
    await c.backups.get(row.id);
    const rt = await c.runtimeOf(row);
    if (await rt.inspect(row.id)) {
      await c.files.write(await rt.pack(row.id), c.files.archive(row.id));
      await rt.destroy(row.id);
    } else if (!(await c.files.exists(c.files.archive(row.id)))) {
      throw new Error("its files are gone from this host");
    }
    // No activity stamp: auto-delete keeps counting from the stop.
    await c.store.update(row.id, { state: "archived", runnerId: null, errorReason: null });
    return {};
  } catch (err) {
    // The sandbox is intact: it stays stopped; the reason is logged and answered.
    const reason = reasonOf(err);
    c.log(`sandbox ${row.id}: archive failed: ${reason}`);
    await c.store.update(row.id, { desiredState: "stopped" });
    return { failed: reason };
  }
}

export async function deleteSandbox(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  const op = c.operate(row.id, () => deleteChecked(c, row.id));
  return c.answer(row.id, op, "Sandbox failed to delete", errors.internal);
}

/** Delete with the preconditions checked under the lock; `when` lets a timer re-check its reason. */
export async function deleteChecked(c: OperationContext, id: string, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
  const cur = await c.current(id);
  if (when && !when(cur)) return {};
  if (cur.state === "destroyed" || (cur.desiredState === "destroyed" && isErrored(cur.state))) {
    throw errors.notFound(`Sandbox with ID or name ${id} not found`);
  }
  await c.runtimeOf(cur);
  await softDelete(c, cur);
  return driveDestroy(c, cur);
}

/** The reference's soft delete: desired `destroyed`, the name freed, no backup any more. */
export async function softDelete(c: OperationContext, row: SandboxRecord): Promise<void> {
  const name = row.name.startsWith("DESTROYED_") ? row.name : `DESTROYED_${row.name}_${Date.now()}`;
  await c.store.update(row.id, { desiredState: "destroyed", name, backupState: "None" });
}

/** Removes the sandbox from the host and its packs from disk; a failure is retried by the timers. */
export async function driveDestroy(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  try {
    await c.backups.get(row.id);
    const rt = await c.runtimeOf(row);
    await rt.destroy(row.id);
    await c.files.remove(row.id);
    await c.store.update(row.id, { state: "destroyed", runnerId: null, errorReason: null });
    c.activity.forget(row.id);
    // Its captured layers go once no other sandbox (a fork) or snapshot stands on them.
    if (row.layers?.length) await sweepLayers(c, rt).catch((err: unknown) => c.log(`sandbox ${row.id}: sweeping layers: ${String(err)}`));
    return {};
  } catch (err) {
    return c.fail(row.id, err);
  }
}
