import { basename } from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { FileService, type UploadFileRequestSchema, type UploadFilesRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { formParts, type FormPart } from "./multipart-parts.ts";
import { noteMoved } from "./gc-pacer.ts";
import { sendJson } from "./http.ts";
import { textProblems } from "../../services/validate.ts";
import type { RestHandler } from "./routes.ts";

type UploadMessage = MessageInitShape<typeof UploadFilesRequestSchema> & MessageInitShape<typeof UploadFileRequestSchema>;

const FIELD = /^files\[(\d+)\]\.(path|file)$/;

/**
 * `POST …/files/bulk-upload`: per file a text field `files[i].path` (the destination) before the
 * file field `files[i].file`, any number of files, streamed into the agent's upload as they arrive.
 */
export const bulkUpload: RestHandler = async ({ req, res, caller }) => {
  const input = remembering(bulkUploadMessages(formParts(req)));
  const out = await caller.clientStream(FileService.method.uploadFiles, input).catch(input.rethrow);
  sendJson(res, 200, { files: out.files.map((f) => ({ path: f.path, bytes: Number(f.bytes) })) });
};

/** `POST …/files/upload?path=`: one file in the multipart field `file`. */
export const singleUpload: RestHandler = async ({ req, res, caller, query }) => {
  const path = query.get("path") ?? "";
  const input = remembering(singleUploadMessages(formParts(req), path));
  const out = await caller.clientStream(FileService.method.uploadFile, input).catch(input.rethrow);
  sendJson(res, 200, { path: out.file?.path ?? path, bytes: Number(out.file?.bytes ?? 0n) });
};

/**
 * `POST …/files/upload-v2?path=` (0.218's uploadFile, and its signed uploadUrl): the file in the
 * multipart field `file`, or the raw body (any other content type); answers {name, path, type}.
 */
export const uploadV2: RestHandler = async ({ req, res, caller, query }) => {
  const path = query.get("path") ?? "";
  // Before any of the body is read: a raw body would otherwise be cut off mid-stream by the check.
  const problems = textProblems("path", "path", path);
  if (problems.length) throw errors.invalidArgument(problems.join(", "));
  const multipart = /^multipart\/form-data/i.test(req.headers["content-type"] ?? "");
  const input = remembering(multipart ? singleUploadMessages(formParts(req), path) : rawUploadMessages(req, path));
  const out = await caller.clientStream(FileService.method.uploadFile, input).catch(input.rethrow);
  const saved = out.file?.path ?? path;
  sendJson(res, 200, { name: basename(saved), path: saved, type: "file" });
};

async function* rawUploadMessages(body: AsyncIterable<Buffer>, path: string): AsyncGenerator<UploadMessage> {
  if (path.trim() === "") throw errors.invalidArgument("path is required");
  yield { part: { case: "header", value: { path } } };
  for await (const chunk of body) {
    noteMoved(chunk.length);
    yield { part: { case: "data", value: chunk } };
  }
}

async function* bulkUploadMessages(parts: AsyncIterable<FormPart>): AsyncGenerator<UploadMessage> {
  const destinations = new Map<string, string>();
  for await (const part of parts) {
    const m = FIELD.exec(part.name);
    if (!m) {
      continue; // Not ours: skipped (unread), as the reference does.
    }
    const [, index, what] = m;
    if (what === "path") {
      const path = (await partText(part)).trim();
      if (path === "") throw errors.invalidArgument(`files[${index}].path is empty`);
      destinations.set(index, path);
      continue;
    }
    const path = destinations.get(index);
    if (path === undefined) throw errors.invalidArgument(`files[${index}].file: missing files[${index}].path before it`);
    destinations.delete(index);
    yield { part: { case: "header", value: { path } } };
    yield* content(part);
  }
}

async function* singleUploadMessages(parts: AsyncIterable<FormPart>, path: string): AsyncGenerator<UploadMessage> {
  if (path.trim() === "") throw errors.invalidArgument("path is required");
  let sent = false;
  for await (const part of parts) {
    if (part.name !== "file" || sent) continue;
    sent = true;
    yield { part: { case: "header", value: { path } } };
    yield* content(part);
  }
  if (!sent) throw errors.invalidArgument('the multipart field "file" is missing');
}

/** A small part's whole content as text (a path sent as a file part). */
async function partText(part: FormPart, limit = 64 * 1024): Promise<string> {
  if (part.kind === "field") {
    if (part.truncated) throw errors.invalidArgument(`${part.name} is too long`);
    return part.value;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of part.chunks) {
    size += chunk.length;
    if (size > limit) throw errors.invalidArgument(`${part.name} is too long`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}

async function* content(part: FormPart): AsyncGenerator<UploadMessage> {
  if (part.kind === "field") {
    // A client that sent the content without a filename (nor octet-stream): a text field.
    if (part.truncated) throw errors.invalidArgument(`${part.name} is too large for a text field: send it as a file`);
    if (part.value !== "") yield { part: { case: "data", value: Buffer.from(part.value, "utf8") } };
    return;
  }
  // A message per read as it came: the agent's transport joins them into frames of
  // UPLOAD_FRAME_BYTES (upload-frames.ts) without copying them twice.
  for await (const chunk of part.chunks) {
    noteMoved(chunk.length);
    yield { part: { case: "data", value: chunk } };
  }
}

/**
 * The request body's own problem (a malformed or incomplete multipart body) is what the client
 * must hear, not the cancelled call it caused.
 */
function remembering<T>(source: AsyncGenerator<T>): AsyncGenerator<T> & { rethrow: (err: unknown) => never } {
  let failure: unknown;
  async function* gen() {
    try {
      yield* source;
    } catch (err) {
      failure = err;
      throw err;
    }
  }
  return Object.assign(gen(), {
    rethrow: (err: unknown): never => {
      throw failure ?? err;
    },
  });
}
