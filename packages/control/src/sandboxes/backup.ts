import type { SandboxRecord } from "../db/entities.ts";
import { bad, type OperationContext, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import { isEphemeral } from "./states.ts";

// A backup: the sandbox's writable layer packed beside it while it keeps running (or stays
// stopped). It runs outside the operation lock; archive and destroy wait for it (the context's
// `backups`), and a start finds it when the host lost the sandbox's files.

export async function backup(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  c.assertOpen();
  const row = await c.store.find(organizationId, idOrName);
  if (isEphemeral(row.autoDeleteInterval)) throw bad("Ephemeral sandboxes cannot be backed up");
  if (row.backupState === "Pending" || row.backupState === "InProgress") throw bad("Sandbox backup is already in progress");
  if (c.locks.busy(row.id) || row.state !== row.desiredState) throw stateChangeInProgress();
  // A paused sandbox packs as it is: nothing in it writes meanwhile.
  if (row.state !== "started" && row.state !== "stopped" && row.state !== "paused") throw bad("Sandbox is not in valid state");
  const rt = await c.runtimeOf(row);
  const claimed = await c.store.updateIf(row.id, { backupState: { $in: ["None", "Completed", "Error"] } }, { backupState: "InProgress" });
  if (!claimed) throw bad("Sandbox backup is already in progress");
  const id = row.id;
  const work = (async () => {
    try {
      await c.files.write(await rt.pack(id), c.files.backup(id));
      await c.store.updateIf(id, { backupState: "InProgress" }, { backupState: "Completed", backupCreatedAt: new Date() });
    } catch (err) {
      c.log(`sandbox ${id}: backup failed: ${reasonOf(err)}`);
      await c.store.updateIf(id, { backupState: "InProgress" }, { backupState: "Error" }).catch(() => undefined);
    }
  })().finally(() => c.backups.delete(id));
  c.backups.set(id, work);
  c.activity.touch(id);
  return c.current(id);
}
