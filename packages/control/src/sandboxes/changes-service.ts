import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { type SandboxChange, SandboxChangeSchema, type SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import type { Change } from "@sandbar/runner";
import { organizationOf } from "../call/call.ts";
import type { Checkpoints } from "./changes.ts";
import type { SandboxManager } from "./manager.ts";

// SandboxChangesService: a changeset as pages of entries (the cursor is the last path of a page:
// the runner's walk order continues after it) or as the bytes of a tar or a diff.

const DEFAULT_LIMIT = 1000;
const MAX_LIMIT = 10_000;

function toChange(c: Change): SandboxChange {
  return create(SandboxChangeSchema, { path: c.path, kind: c.kind, type: c.type, size: BigInt(c.size), mode: c.mode, mtime: timestampFromDate(c.mtime) });
}

/** `checkpoints`: the snapshot table, where `since` names a checkpoint (absent: `since` answers 400). */
export function sandboxChangesService(manager: SandboxManager, checkpoints?: Checkpoints): Partial<ServiceImpl<typeof SandboxChangesService>> {
  return {
    async listSandboxChanges(req, ctx) {
      const org = organizationOf(ctx);
      const limit = req.limit ?? DEFAULT_LIMIT;
      if (limit < 1 || limit > MAX_LIMIT) throw errors.invalidArgument(`limit: must be between 1 and ${MAX_LIMIT}`);
      const since = req.since ? { name: req.since, checkpoints } : undefined;
      const items: SandboxChange[] = [];
      let more = false;
      // One entry past the page tells whether another follows; leaving the loop ends the runner's read.
      for await (const part of manager.changes(org, req.sandboxId, { format: "list", prefix: req.pathPrefix || undefined, after: req.cursor || undefined, consistent: req.consistent }, since)) {
        if (part.case !== "change") continue;
        if (items.length === limit) {
          more = true;
          break;
        }
        items.push(toChange(part.value));
      }
      return { items, ...(more ? { nextCursor: items[items.length - 1].path } : {}) };
    },

    async *exportSandboxChanges(req, ctx) {
      const org = organizationOf(ctx);
      if (req.format !== "tar" && req.format !== "diff") throw errors.invalidArgument(`format: must be tar or diff (got ${JSON.stringify(req.format)})`);
      const since = req.since ? { name: req.since, checkpoints } : undefined;
      for await (const part of manager.changes(org, req.sandboxId, { format: req.format, prefix: req.pathPrefix || undefined, consistent: req.consistent }, since)) {
        if (part.case === "data") yield { data: part.value };
      }
    },
  };
}
