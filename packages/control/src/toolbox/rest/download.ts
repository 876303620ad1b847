import { randomBytes } from "node:crypto";
import { basename } from "node:path";
import { errors } from "@sandbar/protocol";
import { DownloadFilesRequestSchema, FileService, type DownloadError } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { noteMoved } from "./gc-pacer.ts";
import { DecodeErrors, readJsonMessage, write } from "./http.ts";
import type { RestHandler } from "./routes.ts";

/**
 * `POST …/files/bulk-download {"paths":[…]}`: a multipart/form-data answer, one part per path in
 * request order: `name="file"` with the bytes, or `name="error"` with the reference's error JSON.
 * The SDKs match parts to paths by filename, so it echoes the requested path exactly
 * (`filename*` carries it byte for byte; `filename` is the Latin-1-safe rendering). Streamed: a
 * failure in the middle of a file ends the response without the closing boundary.
 */
export const bulkDownload: RestHandler = async ({ req, res, caller }) => {
  const errs = new DecodeErrors();
  const input = await readJsonMessage(req, DownloadFilesRequestSchema, errs);
  const messages = caller.serverStream(FileService.method.downloadFiles, input, errs.messages)[Symbol.asyncIterator]();
  // The first message (or error) comes before the status is committed: a refused call keeps its status.
  let next = await messages.next();
  const boundary = `sandbar-${randomBytes(12).toString("hex")}`;
  res.writeHead(200, { "content-type": `multipart/form-data; boundary=${boundary}` });
  let parts = 0;
  const startPart = async (headers: string) => {
    await write(res, Buffer.from(`${parts++ === 0 ? "" : "\r\n"}--${boundary}\r\n${headers}\r\n`, "latin1"));
  };
  while (!next.done) {
    const part = next.value.part;
    if (part.case === "file") {
      await startPart(`${disposition("file", part.value.path)}\r\nContent-Length: ${part.value.size}\r\nContent-Type: application/octet-stream\r\n`);
    } else if (part.case === "data") {
      noteMoved(part.value.length);
      await write(res, part.value);
    } else if (part.case === "error") {
      const body = errorBody(part.value);
      await startPart(`${disposition("error", part.value.path)}\r\nContent-Type: application/json; charset=utf-8\r\n`);
      await write(res, body);
    }
    next = await messages.next();
  }
  res.end(`${parts === 0 ? "" : "\r\n"}--${boundary}--\r\n`);
};

/** `GET …/files/download?path=`: the file's bytes, streamed. */
export const singleDownload: RestHandler = async ({ res, caller, query }) => {
  const messages = caller.serverStream(FileService.method.downloadFile, { path: query.get("path") ?? "" })[Symbol.asyncIterator]();
  let next = await messages.next();
  const info = !next.done && next.value.part.case === "info" ? next.value.part.value : undefined;
  if (!info) throw errors.internal("the agent answered a download without the file's info");
  res.writeHead(200, {
    "content-type": "application/octet-stream",
    "content-disposition": `attachment; ${filenameParams(info.name || basename(query.get("path") ?? ""))}`,
  });
  next = await messages.next();
  while (!next.done) {
    if (next.value.part.case === "data") {
      noteMoved(next.value.part.value.length);
      await write(res, next.value.part.value);
    }
    next = await messages.next();
  }
  res.end();
};

function disposition(name: string, path: string): string {
  return `Content-Disposition: form-data; name="${name}"; ${filenameParams(path)}`;
}

/**
 * `filename="…"` with `\` and `"` escaped, CR, LF and NUL dropped, other control characters and
 * characters beyond Latin-1 replaced by `_`; then `filename*=utf-8''…` (RFC 5987), exact.
 */
function filenameParams(path: string): string {
  let quoted = "";
  for (const ch of path) {
    const c = ch.codePointAt(0)!;
    if (ch === "\\" || ch === '"') quoted += "\\" + ch;
    else if (c === 0x0d || c === 0x0a || c === 0) continue;
    else if (c < 0x20 || c === 0x7f || c > 0xff) quoted += "_";
    else quoted += ch;
  }
  let ext = "";
  for (const b of Buffer.from(path, "utf8")) {
    const ch = String.fromCharCode(b);
    ext += /[A-Za-z0-9!#$&+\-.^_`|~]/.test(ch) ? ch : `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return `filename="${quoted}"; filename*=utf-8''${ext}`;
}

/** The reference daemon's per-file error body. */
function errorBody(e: DownloadError): string {
  return JSON.stringify({
    statusCode: e.statusCode || 500,
    message: e.message,
    code: e.code || "FILE_READ_FAILED",
    timestamp: new Date().toISOString(),
    path: e.path,
    method: "POST",
  });
}
