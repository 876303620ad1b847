import type { IncomingMessage, ServerResponse } from "node:http";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import { type DecodeErrors, MAX_JSON_DEPTH, textNestsDeeper } from "./json.ts";

/** JSON request bodies are small; uploads stream through their own routes and are not limited by this. */
export const MAX_JSON_BODY = 10 * 1024 * 1024;
/** How much of a too-large body is read and dropped so the client can read its 413; past that the connection closes. */
const MAX_DRAIN = 64 * 1024 * 1024;

/** The metadata that carries an HTTP status an error answers instead of its code's (413, 426, 502...). */
export const HTTP_STATUS_META = "x-sandbar-http-status";

/** An error that answers `status` over HTTP (and `code` over RPC). */
export function httpError(status: number, message: string, code: Code = Code.InvalidArgument): ConnectError {
  return new ConnectError(message, code, { [HTTP_STATUS_META]: String(status) });
}

/** 413 over REST (RESOURCE_EXHAUSTED over RPC, as Connect itself answers a message over its limit). */
function payloadTooLarge(limit: number): ConnectError {
  return new ConnectError(`Request body is larger than the limit of ${limit} bytes`, Code.ResourceExhausted, { [HTTP_STATUS_META]: "413" });
}

/**
 * 426 over REST: a WebSocket route asked for without the WebSocket handshake (over HTTP/2, whose
 * extended CONNECT is not served, or HTTP/1.1 without `Upgrade: websocket`).
 */
export function upgradeRequired(path: string): ConnectError {
  return new ConnectError(`${path} is a WebSocket: open it with an HTTP/1.1 request with Upgrade: websocket (WebSockets over HTTP/2 are not served)`, Code.FailedPrecondition, {
    [HTTP_STATUS_META]: "426",
  });
}

/** The HTTP status an error asks for instead of its code's, if any. */
export function statusOverride(err: ConnectError): number | undefined {
  const v = Number(err.metadata.get(HTTP_STATUS_META));
  return Number.isInteger(v) && v >= 400 && v < 600 ? v : undefined;
}

/**
 * The request's JSON body (undefined when empty); malformed JSON is a problem in `errs`, raised
 * after the guard. Call it only once the caller is known: it reads up to `limit` bytes.
 */
export async function readJsonBody(req: IncomingMessage, errs: DecodeErrors, limit = MAX_JSON_BODY): Promise<unknown> {
  const text = await readBody(req, limit);
  if (text.trim() === "") return undefined;
  if (textNestsDeeper(text)) return errs.add(`request body nests deeper than ${MAX_JSON_DEPTH} levels`);
  try {
    return JSON.parse(text);
  } catch {
    errs.add("Invalid JSON in request body");
    return undefined;
  }
}

/**
 * Reads the body up to `limit` bytes. A larger one is refused with 413 once it has been read
 * (and dropped), so that the client, still sending, gets the answer rather than a reset; a body
 * beyond MAX_DRAIN is refused at once and the connection closed after the answer.
 */
function readBody(req: IncomingMessage, limit: number): Promise<string> {
  const declared = Number(req.headers["content-length"]);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const tooLarge = () => {
      req.removeAllListeners("data");
      req.resume(); // what is still in flight is read and dropped
      reject(payloadTooLarge(limit));
    };
    if (Number.isFinite(declared) && declared > MAX_DRAIN) {
      closeAfterResponse(req);
      return tooLarge();
    }
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > MAX_DRAIN) {
        closeAfterResponse(req);
        return tooLarge();
      }
      if (size > limit) {
        chunks.length = 0;
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => (size > limit ? reject(payloadTooLarge(limit)) : resolve(Buffer.concat(chunks).toString("utf8"))));
    req.on("error", reject);
  });
}

/** Marks the request so that its connection is closed once the answer is written (HTTP/1.1). */
function closeAfterResponse(req: IncomingMessage): void {
  (req as IncomingMessage & { closeAfterResponse?: boolean }).closeAfterResponse = true;
}

/** Aborted when the client goes away before the response is finished (a finished one needs no abort: it is not free). */
export function requestSignal(res: ServerResponse): AbortSignal {
  const abort = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort.signal;
}

/**
 * True once what is written can no longer reach the client. HTTP/2's compatibility response has no
 * `destroyed`; its stream does.
 */
function responseGone(res: ServerResponse): boolean {
  const stream = (res as { stream?: { destroyed: boolean } }).stream;
  return stream ? stream.destroyed : res.destroyed;
}

/** Writes a chunk, waiting while the client reads slower than we produce; throws once the client is gone. */
export async function write(res: ServerResponse, chunk: Uint8Array | string): Promise<void> {
  if (responseGone(res)) throw errors.unavailable("the client went away");
  if (res.write(chunk)) return;
  await new Promise<void>((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

/** A JSON response with its length. */
export function sendJson(res: ServerResponse, status: number, body: unknown, extra?: Record<string, string>): void {
  const text = JSON.stringify(body);
  const headers: Record<string, string | number> = { ...extra, "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text) };
  const req = (res as ServerResponse & { req?: IncomingMessage & { closeAfterResponse?: boolean } }).req;
  if (req?.closeAfterResponse && req.httpVersionMajor === 1) headers.connection = "close";
  res.writeHead(status, headers);
  res.end(text);
}
