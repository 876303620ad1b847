import { errors } from "@sandbar/protocol";
import type { ChangeSource } from "../provider.ts";
import { changesArchive } from "./change-archive.ts";
import { changesDiff } from "./change-diff.ts";
import { type Change, pathSegments, walkChanges } from "./changes.ts";

// One changeset read, as the runtime contract serves it: the query checked, the provider's
// layers held, the walk's entries (format "list") or the bytes of its archive or diff, and the
// layers released however the read ends (done, failed, or the reader gone).

export type ChangesFormat = "list" | "tar" | "diff";

export interface ChangesQuery {
  format: ChangesFormat;
  /** Only paths at or below this sandbox path. */
  prefix?: string;
  /** Only paths after this one in walk order (list pages: the previous page's last path). */
  after?: string;
  /** Freeze the sandbox for the read (a consistent view); it is always thawed after. */
  consistent?: boolean;
  /**
   * Changes since a checkpoint instead of the sandbox's creation: the checkpoint's captured layers
   * (top first), on the sandbox's image. Empty or absent: since creation.
   */
  since?: string[];
}

/** One part of a changeset read: an entry (format "list") or bytes (tar, diff). */
export type ChangesPart = { case: "change"; value: Change } | { case: "data"; value: Uint8Array };

/** Throws INVALID_ARGUMENT for a query no read can answer. */
function checkChangesQuery(q: ChangesQuery): void {
  if (!["list", "tar", "diff"].includes(q.format)) throw errors.invalidArgument(`format: must be one of list, tar, diff (got ${JSON.stringify(q.format)})`);
  for (const [name, value] of [["pathPrefix", q.prefix], ["cursor", q.after]] as const) {
    if (value === undefined || value === "") continue;
    try {
      pathSegments(value);
    } catch (err) {
      throw errors.invalidArgument(`${name}: ${(err as Error).message}`);
    }
    if (value.includes("\0")) throw errors.invalidArgument(`${name}: must not contain NUL`);
  }
}

/** Reads a changeset from `open`'s layers; they are released when the iteration ends, however. */
export async function* readChangeset(open: () => Promise<ChangeSource>, q: ChangesQuery): AsyncGenerator<ChangesPart> {
  checkChangesQuery(q);
  const source = await open();
  try {
    const walk = walkChanges(source.layers, { prefix: q.prefix || undefined, after: q.after || undefined });
    if (q.format === "list") {
      for await (const { path, kind, type, size, mode, mtime } of walk) yield { case: "change", value: { path, kind, type, size, mode, mtime } };
      return;
    }
    const bytes = q.format === "tar" ? changesArchive(walk) : changesDiff(walk);
    try {
      for await (const chunk of bytes) yield { case: "data", value: chunk instanceof Uint8Array ? chunk : Buffer.from(String(chunk)) };
    } finally {
      bytes.destroy();
    }
  } finally {
    await source.release();
  }
}
