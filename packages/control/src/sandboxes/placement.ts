import { errors } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import type { Exec } from "../db/exec.ts";
import type { OperationContext } from "./operation-context.ts";
import type { SandboxRuntime } from "./runtime.ts";

// Where a sandbox runs: a registered runner of its region (picked inside the transaction that
// admits it), and that runner holding the sandbox's image before it makes the sandbox.

/** A registered runner for the sandbox, in the caller's transaction; the GPU model it gets there is recorded on the row. */
export async function place(c: OperationContext, exec: Exec, row: SandboxRecord, gpuTypes: readonly string[]): Promise<string> {
  const placement = await c.runners!.place(exec, row.regionId, { ...row, gpuTypes });
  if (!placement) return c.runtime.runnerId;
  row.gpuType = placement.gpuType;
  return placement.runnerId;
}

/**
 * A remote runner lacking the sandbox's image pulls it first, from the snapshot's registry with
 * the organization's credentials. A create reads `pulling_snapshot` meanwhile (reconcile redoes
 * the create when a crash leaves it there); a restore stays `restoring`.
 */
export async function holdImage(c: OperationContext, row: SandboxRecord, rt: SandboxRuntime): Promise<void> {
  if (!row.imageRef || !rt.pullImage || !rt.holdsImage || (await rt.holdsImage(row.imageRef))) return;
  if (!c.imageSource) throw errors.failedPrecondition("This server cannot tell runners where snapshot images come from");
  const { name, credentials } = await c.imageSource(row.organizationId, row.imageRef);
  const creating = (await c.current(row.id)).state === "unknown";
  if (creating) await c.store.update(row.id, { state: "pulling_snapshot" });
  await rt.pullImage(row.imageRef, name, credentials);
  if (row.runnerId) await c.runners?.holds?.(row.runnerId, row.imageRef);
  if (creating) await c.store.update(row.id, { state: "unknown" });
}
