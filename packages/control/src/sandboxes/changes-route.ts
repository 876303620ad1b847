import { create } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import {
  ExportSandboxChangesRequestSchema,
  ListSandboxChangesRequestSchema,
  SandboxChangeListSchema,
  SandboxChangesChunkSchema,
  SandboxChangesService,
} from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { isMessage } from "@bufbuild/protobuf";
import { contextFor } from "../call/call.ts";
import type { CallChain } from "../call/chain.ts";
import { type HandwrittenRoute, messageToJson, sendJson, write } from "../gateway/rest-route.ts";
import { textProblems } from "../services/validate.ts";

// GET /sandbox/{id}/changes: a page of entries as JSON (ListSandboxChanges), or with
// `?format=tar` / `?format=diff` (or at /changes/tar, /changes/diff) the raw bytes of
// ExportSandboxChanges with their own content type (the contract's raw streams are text/plain).
// One path, two methods: written by hand, in front of the contract's bindings, both invoked
// through the call chain with the request's call.

const LIST = SandboxChangesService.method.listSandboxChanges;
const EXPORT = SandboxChangesService.method.exportSandboxChanges;

const CONTENT_TYPES: Record<string, string> = { tar: "application/x-tar", diff: "text/x-diff; charset=utf-8" };

function flag(value: string | null, name: string, problems: string[]): boolean | undefined {
  if (value === null) return undefined;
  if (value === "true" || value === "false") return value === "true";
  problems.push(`${name}: must be true or false`);
  return undefined;
}

type RestCall = Parameters<HandwrittenRoute["serve"]>[0];

async function serve(chain: CallChain, { res, params, query, signal, call }: RestCall): Promise<void> {
  const sandboxId = params.sandbox_id ?? "";
  const problems = textProblems("sandbox_id", "sandboxId", sandboxId);
  const inPath = params.format !== undefined;
  const format = params.format ?? query.get("format") ?? "json";
  const common = {
    sandboxId,
    pathPrefix: query.get("pathPrefix") ?? query.get("path_prefix") ?? undefined,
    consistent: flag(query.get("consistent"), "consistent", problems),
    since: query.get("since") ?? undefined,
  };
  if (format === "json" && !inPath) {
    const rawLimit = query.get("limit");
    const limit = rawLimit === null ? undefined : Number(rawLimit);
    if (limit !== undefined && !(Number.isInteger(limit) && limit >= 0 && limit <= 0xffffffff)) problems.push("limit: must be a whole number");
    const input = create(ListSandboxChangesRequestSchema, { ...common, cursor: query.get("cursor") ?? undefined, limit: problems.length > 0 ? undefined : limit });
    const out = await chain.unary(contextFor(call, LIST, signal, problems), input);
    if (!isMessage(out, SandboxChangeListSchema)) throw errors.internal("ListSandboxChanges answered another message");
    return sendJson(res, 200, messageToJson(SandboxChangeListSchema, out, { omitUnset: true }));
  }
  if (!(format in CONTENT_TYPES)) throw errors.invalidArgument(`format: must be one of ${inPath ? "tar, diff" : "json, tar, diff"} (got ${JSON.stringify(format)})`);
  const input = create(ExportSandboxChangesRequestSchema, { ...common, format });
  const messages = chain.stream(contextFor(call, EXPORT, signal, problems), input)[Symbol.asyncIterator]();
  // The first chunk before the 200: a refusal (404, 400) still gets its status.
  let next = await messages.next();
  res.writeHead(200, { "content-type": CONTENT_TYPES[format], ...(format === "tar" ? { "content-disposition": 'attachment; filename="changes.tar"' } : {}) });
  try {
    while (!next.done) {
      if (isMessage(next.value, SandboxChangesChunkSchema)) await write(res, next.value.data);
      next = await messages.next();
    }
  } catch (err) {
    await messages.return?.(undefined).catch(() => undefined);
    throw err;
  }
  res.end();
}

/** The list (and ?format=) at /changes; the export's own binding /changes/{format}, with its content type. */
export function changesRoutes(chain: CallChain): HandwrittenRoute[] {
  return [
    { verb: "GET", template: "/sandbox/{sandbox_id}/changes", method: LIST, serve: (c) => serve(chain, c) },
    { verb: "GET", template: "/sandbox/{sandbox_id}/changes/{format}", method: EXPORT, serve: (c) => serve(chain, c) },
  ];
}
