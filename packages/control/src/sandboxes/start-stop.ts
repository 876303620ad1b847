import type { SandboxRecord } from "../db/entities.ts";
import { driveDestroy, softDelete } from "./archive-delete.ts";
import { newAuthToken } from "./auth-token.ts";
import { specOf } from "./create.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import { resume } from "./pause-resume.ts";
import { holdImage, place } from "./placement.ts";
import { isEphemeral, isErrored } from "./states.ts";
import type { SandboxPatch } from "./store.ts";

// Start (a stopped sandbox, an archived one restored from its archive, one whose first process
// died) and stop, with the reference's preconditions; the drive* steps do the host's part and
// are what reconcile.ts redoes after a crash.

export async function start(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  if (isErrored(row.state) && !(await recoverable(c, row))) throw bad("Sandbox is in an errored state");
  if (row.state === "started" && row.desiredState === "started" && !c.locks.busy(row.id) && !(await lost(c, row))) return row;
  if (row.state === "paused") return c.answer(row.id, resume(c, row.id), "Sandbox failed to start"); // a resume (or the one in flight)
  const op = c.operate(row.id, async () => {
    const cur = await c.current(row.id);
    const gone = await lost(c, cur); // died since the timers last looked
    if (isErrored(cur.state) || gone) {
      if (!gone && !(await recoverable(c, cur))) throw bad("Sandbox is in an errored state");
      // Reported `starting` meanwhile; its leftovers are torn down by the runtime's start.
      await c.store.updateAdmitted(cur, cur, { state: "stopped", desiredState: "started", authToken: newAuthToken(), errorReason: null, recoverable: false, lastActivityAt: new Date() });
      return driveStart(c, cur);
    }
    if (cur.state === "started" && cur.desiredState === "started") return {};
    if (cur.state !== cur.desiredState) throw stateChangeInProgress();
    if (cur.state !== "stopped" && cur.state !== "archived") throw bad("Sandbox is not in valid state");
    const archived = cur.state === "archived";
    if (!archived) await c.runtimeOf(cur);
    // An archived sandbox of a region with registered runners is placed again, as a create is.
    const placed = archived && ((await c.runners?.servesRegion(cur.regionId)) ?? false);
    const patch: SandboxPatch = {
      desiredState: "started",
      authToken: newAuthToken(),
      errorReason: null,
      lastActivityAt: new Date(),
      ...(archived ? { state: "restoring", runnerId: c.runtime.runnerId } : {}),
    };
    // A stopped sandbox holds its disk already; an archived one takes it again.
    await c.store.updateAdmitted(cur, { ...cur, disk: archived ? cur.disk : 0 }, patch, { place: placed ? (exec) => place(c, exec, cur, cur.gpuType ? [cur.gpuType] : []) : undefined });
    return archived ? driveRestore(c, { ...cur, runnerId: patch.runnerId ?? null }, c.files.archive(cur.id), "archived") : driveStart(c, cur);
  });
  return c.answer(row.id, op, "Sandbox failed to start");
}

/**
 * Starts a stopped sandbox. When the host no longer has it (its files were lost), the last
 * completed backup brings it back; without one the sandbox goes to `error`.
 */
export async function driveStart(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  try {
    const rt = await c.runtimeOf(row);
    if (!(await rt.inspect(row.id))) {
      if (row.backupState === "Completed" && (await c.files.exists(c.files.backup(row.id)))) {
        await c.store.update(row.id, { state: "restoring" });
        return driveRestore(c, row, c.files.backup(row.id), "error");
      }
      return c.fail(row.id, new Error("Sandbox has no runner and backup is not completed: its files are gone from this host"));
    }
    await rt.start(row.id);
    return { row: await c.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() }) };
  } catch (err) {
    return c.fail(row.id, err);
  }
}

/**
 * Restores the sandbox from a pack (archive or backup), then starts it. An archive is removed
 * only once the sandbox runs from it; if restoring fails, an archived sandbox goes back to
 * `archived` (its archive is still the whole of its files) with the reason recorded.
 */
export async function driveRestore(c: OperationContext, row: SandboxRecord, pack: string, onFailure: "archived" | "error"): Promise<Outcome> {
  try {
    if (!(await c.files.exists(pack))) throw new Error(`the pack of its files (${pack}) is missing`);
    const rt = await c.runtimeOf(row);
    await rt.destroy(row.id); // whatever an interrupted restore left
    await holdImage(c, row, rt);
    await rt.restore(specOf(row), c.files.read(pack));
    await rt.start(row.id);
    await c.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() });
    if (pack === c.files.archive(row.id)) await c.files.removeArchive(row.id);
    return {};
  } catch (err) {
    const reason = reasonOf(err);
    if (onFailure === "error") return c.fail(row.id, err);
    c.log(`sandbox ${row.id}: restore failed: ${reason}`);
    await c.runtimeOf(row).then((rt) => rt.destroy(row.id)).catch(() => undefined);
    await c.store.update(row.id, { state: "archived", desiredState: "archived", runnerId: null, errorReason: reason });
    return { failed: reason };
  }
}

export async function stop(c: OperationContext, organizationId: string, idOrName: string, force = false): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  if (isErrored(row.state) && !(await recoverable(c, row))) throw bad("Sandbox is in an errored state");
  const op = c.operate(row.id, () => stopChecked(c, row.id, force));
  return c.answer(row.id, op, "Sandbox failed to stop");
}

/** Stop with the preconditions checked under the lock; `when` lets a timer re-check its reason. */
export async function stopChecked(c: OperationContext, id: string, force: boolean, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
  const cur = await c.current(id);
  if (when && !when(cur)) return {};
  const recovering = isErrored(cur.state) && (await recoverable(c, cur));
  if (isErrored(cur.state) && !recovering) throw bad("Sandbox is in an errored state");
  if (!recovering && cur.state !== cur.desiredState) throw stateChangeInProgress();
  if (!recovering && cur.state !== "started" && cur.state !== "paused") throw bad("Sandbox is not in a stoppable state");
  await c.runtimeOf(cur);
  if (isEphemeral(cur.autoDeleteInterval)) {
    await softDelete(c, cur);
    return driveDestroy(c, cur);
  }
  await c.store.update(id, { desiredState: "stopped" });
  return driveStop(c, cur, force);
}

export async function driveStop(c: OperationContext, row: SandboxRecord, force = false): Promise<Outcome> {
  try {
    await (await c.runtimeOf(row)).stop(row.id, { force });
    return { row: await c.store.update(row.id, { state: "stopped", errorReason: null, lastActivityAt: new Date() }) };
  } catch (err) {
    return c.fail(row.id, err);
  }
}

/**
 * The 0.218 client's recover: a sandbox in `error` whose reason is recoverable (see `recoverable`)
 * is started again (or, with skipStart, stopped); any other sandbox is a 400 saying why.
 */
export async function recover(c: OperationContext, organizationId: string, idOrName: string, skipStart = false): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  if (!isErrored(row.state)) throw bad(`Sandbox is not in an errored state (it is ${row.state}): there is nothing to recover`);
  // As the DTO says (the timers marked it so), and still so on its host.
  if (!row.recoverable || !(await recoverable(c, row))) throw bad(`Sandbox error is not recoverable: ${row.errorReason ?? "unknown reason"}`);
  return skipStart ? stop(c, organizationId, row.id) : start(c, organizationId, row.id);
}

/**
 * An `error` the user can leave with start (or stop): the sandbox was running here and its
 * first process died (an OOM kill, its agent's supervisor giving up, a crash); its files are
 * intact on this host. Other errors (a create or start that failed, files lost, a failed
 * restore or delete) keep the reference's 400 "Sandbox is in an errored state".
 */
async function recoverable(c: OperationContext, row: SandboxRecord): Promise<boolean> {
  if (row.state !== "error" || row.desiredState !== "started" || row.runnerId === null) return false;
  return (await c.runtimeOf(row).then((rt) => rt.inspect(row.id)).catch(() => undefined))?.state === "error";
}

/** Started here, but its first process is gone (not yet marked `error` by the timers). */
async function lost(c: OperationContext, row: SandboxRecord): Promise<boolean> {
  if (row.state !== "started" || row.desiredState !== "started" || row.runnerId === null) return false;
  return (await c.runtimeOf(row).then((rt) => rt.inspect(row.id)).catch(() => undefined))?.state === "error";
}
