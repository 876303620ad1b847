import type { SnapshotPatch, SnapshotRow } from "../snapshots/store.ts";
import { type OperationContext, reasonOf } from "./operation-context.ts";
import type { SandboxRuntime } from "./runtime.ts";

// A running sandbox's snapshot travels (DESIGN.md decision 19): once it is active (and answered),
// the runner holding its layers exports them over its base as an OCI image and pushes it to the
// internal registry with the organization's push account; the snapshot row then names the image
// pinned to its digest, and creates that cannot use the layers pull it (create.ts). A failure is
// logged and recorded on the row, never fatal: the snapshot stays usable where its layers are.

/** What the export records on the snapshot's row. */
interface SnapshotRecords {
  update(id: string, patch: SnapshotPatch): Promise<unknown>;
}

export interface TravellingSnapshot {
  snapshot: SnapshotRow;
  organizationId: string;
  /** Captured layers, top first. */
  layers: string[];
  /** The base image's manifest digest; null: the default snapshot. */
  ref: string | null;
  user: string;
}

/** Starts the export in the background; the context's close waits for it. */
export function exportInBackground(c: OperationContext, snapshots: SnapshotRecords, rt: SandboxRuntime, s: TravellingSnapshot): void {
  const push = c.snapshotPush;
  if (!push) return; // no internal registry: the snapshot stays on its runner
  const job = (async () => {
    const id = s.snapshot.id;
    try {
      if (!rt.exportLayers) throw new Error(`the runner ${rt.runnerId} cannot export layers`);
      const target = await push(s.organizationId, id);
      const t0 = Date.now();
      const out = await rt.exportLayers({ layers: s.layers, ...(s.ref ? { image: s.ref } : {}), user: s.user, push: target });
      const repository = target.image.replace(/:[^:/]+$/, "");
      await snapshots.update(id, { pushedImage: `${repository}@${out.digest}`, pushError: null });
      c.log(`snapshot ${s.snapshot.name} (${id}): pushed as ${repository}@${out.digest} (${out.layers} layers, ${out.bytes} bytes) in ${Date.now() - t0} ms`);
    } catch (err) {
      const reason = reasonOf(err);
      c.log(`snapshot ${s.snapshot.name} (${id}): export to the internal registry failed, it stays on runner ${rt.runnerId}: ${reason}`);
      await snapshots.update(id, { pushError: reason.slice(0, 2000) }).catch(() => undefined);
    }
  })();
  c.exports.add(job);
  void job.finally(() => c.exports.delete(job));
}
