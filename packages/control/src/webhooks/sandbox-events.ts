import type { SandboxRecord } from "../db/entities.ts";
import type { Exec } from "../db/exec.ts";
import { SANDBOX_CLASS } from "../sandboxes/list-query.ts";
import { reportedState } from "../sandboxes/states.ts";
import { recordEvent } from "./events.ts";

// Sandbox events carry the state the API reports (derived from state and desiredState), so a
// receiver sees the same transitions a client polling the sandbox would: started, stopping,
// stopped, and so on.

export type StateColumns = Pick<SandboxRecord, "state" | "desiredState">;

export function recordSandboxCreated(exec: Exec, row: SandboxRecord): Promise<string | undefined> {
  return recordEvent(exec, row.organizationId, "sandbox.created", {
    id: row.id,
    organizationId: row.organizationId,
    state: reportedState(row.state, row.desiredState),
    sandboxClass: row.sandboxClass ?? SANDBOX_CLASS,
    createdAt: row.createdAt.toISOString(),
  }, row.createdAt);
}

/** An event only when the reported state changed. */
export async function recordSandboxStateChange(exec: Exec, id: string, organizationId: string, before: StateColumns, after: StateColumns, at: Date): Promise<void> {
  const oldState = reportedState(before.state, before.desiredState);
  const newState = reportedState(after.state, after.desiredState);
  if (oldState === newState) return;
  await recordEvent(exec, organizationId, "sandbox.state.updated", { id, organizationId, oldState, newState, updatedAt: at.toISOString() }, at);
}
