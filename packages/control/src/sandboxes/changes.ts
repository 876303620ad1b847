import type { ChangesPart, ChangesQuery } from "@sandbar/runner";
import { bad, type OperationContext } from "./operation-context.ts";

// What a sandbox changed since its creation (docs/changesets.md), read on its runner from its
// upper layer. A read, not an operation: no lock; a sandbox that stops meanwhile only ends the
// read early (its upper stays on disk). Started and stopped sandboxes have their upper on a host.

/** Checkpoints (captured layers) are another feature's; until they exist `since` is refused. */
export function refuseSince(since: string | undefined): void {
  if (since !== undefined && since !== "") throw bad("since: checkpoints are not available yet");
}

export async function* changes(c: OperationContext, organizationId: string, idOrName: string, query: ChangesQuery): AsyncGenerator<ChangesPart> {
  const row = await c.store.find(organizationId, idOrName);
  if (row.state !== "started" && row.state !== "stopped") throw bad(`Changes are read from a started or stopped sandbox; this one is ${row.state}`);
  const rt = await c.runtimeOf(row);
  if (!rt.changes) throw bad("Changes are not available on this sandbox's runner");
  yield* rt.changes(row.id, query);
}
