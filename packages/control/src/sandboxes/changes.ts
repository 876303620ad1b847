import { Code, ConnectError } from "@connectrpc/connect";
import type { ChangesPart, ChangesQuery } from "@sandbar/runner";
import type { SandboxRecord } from "../db/entities.ts";
import type { SnapshotRow } from "../snapshots/store.ts";
import { bad, type OperationContext } from "./operation-context.ts";

// What a sandbox changed since its creation or since a checkpoint (docs/changesets.md), read on
// its runner from its overlay layers. A read, not an operation: no lock; a sandbox that stops
// meanwhile only ends the read early (its upper stays on disk). Started and stopped sandboxes
// have their upper on a host.
//
// A checkpoint is a snapshot of a sandbox (POST /sandbox/{id}/snapshot): its captured layers on
// its sandbox's image. It is one of this sandbox's past states when it was taken of this sandbox,
// or of an ancestor before the fork that led here, or when this sandbox (or an ancestor) stands on
// it (made from it). Another snapshot would compare with a tree this sandbox never was.

/** What a changeset needs of the snapshot table: a snapshot the organization sees, by name or id. */
export interface Checkpoints {
  find(organizationId: string, idOrName: string): Promise<SnapshotRow>;
}

/** Ancestors followed at most (as lineage.ts). */
const MAX_ANCESTORS = 100;

const isSuffix = (part: readonly string[], of: readonly string[]) => part.length <= of.length && part.every((l, i) => of[of.length - part.length + i] === l);

/** The checkpoint `since` names, as the runner compares with it: its layers; 400 when it is not one of the sandbox's past states. */
async function checkpointLayers(c: OperationContext, checkpoints: Checkpoints, row: SandboxRecord, since: string): Promise<string[]> {
  const snap = await checkpoints.find(row.organizationId, since).catch((err: unknown) => {
    if (err instanceof ConnectError && err.code === Code.NotFound) throw bad(`since: Snapshot ${since} not found`);
    throw err;
  });
  if (!snap.layers?.length || !snap.runnerId) throw bad(`since: snapshot ${since} is not a checkpoint (only snapshots of a sandbox, POST /sandbox/{id}/snapshot, are)`);
  if (snap.state !== "active") throw bad(`since: snapshot ${since} is ${snap.state}`);
  const layers = snap.layers;
  let related = false;
  // The line back through the parents; `until`: when the child on the line was forked (a later snapshot of the parent is not in it).
  let until: Date | undefined;
  for (let r: SandboxRecord | undefined = row, n = 0; r && !related && n <= MAX_ANCESTORS; n++) {
    related = (snap.sandboxId === r.id && (until === undefined || snap.createdAt <= until)) || isSuffix(layers, r.layers ?? []);
    until = until && until < r.createdAt ? until : r.createdAt;
    r = (r.parentId ? await c.store.byId(r.parentId) : undefined) ?? undefined;
  }
  if (!related || (snap.ref ?? null) !== (row.imageRef ?? null)) throw bad(`since: snapshot ${since} is not an ancestor of this sandbox's filesystem`);
  if (snap.runnerId !== row.runnerId) throw bad(`since: snapshot ${since} is held by another runner than this sandbox's`);
  return layers;
}

export async function* changes(c: OperationContext, organizationId: string, idOrName: string, query: Omit<ChangesQuery, "since">, since?: { name: string; checkpoints?: Checkpoints }): AsyncGenerator<ChangesPart> {
  const row = await c.store.find(organizationId, idOrName);
  if (row.state !== "started" && row.state !== "stopped") throw bad(`Changes are read from a started or stopped sandbox; this one is ${row.state}`);
  let layers: string[] | undefined;
  if (since?.name) {
    if (!since.checkpoints) throw bad("since: checkpoints are not available on this server");
    layers = await checkpointLayers(c, since.checkpoints, row, since.name);
  }
  const rt = await c.runtimeOf(row);
  if (!rt.changes) throw bad("Changes are not available on this sandbox's runner");
  yield* rt.changes(row.id, { ...query, since: layers });
}
