import type { IncomingMessage, ServerResponse } from "node:http";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { DecodeErrors, messageFromJson } from "../../gateway/json.ts";

const MAX_JSON_BODY = 10 * 1024 * 1024;

/** Aborted when the client goes away before the response is finished. */
export function requestSignal(res: ServerResponse): AbortSignal {
  const abort = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort.signal;
}

/**
 * Decodes a JSON request body into a message as the gateway does; problems are collected in
 * `errs` (and raised after the guard). An empty body is an empty message.
 */
export async function readJsonMessage<D extends DescMessage>(req: IncomingMessage, desc: D, errs: DecodeErrors): Promise<MessageShape<D>> {
  const text = await readBody(req);
  let json: unknown = undefined;
  if (text.trim() !== "") {
    try {
      json = JSON.parse(text);
    } catch {
      errs.add("Invalid JSON in request body");
    }
  }
  return messageFromJson(desc, json, errs) as MessageShape<D>;
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > MAX_JSON_BODY) {
        reject(errors.invalidArgument("Request body is too large"));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

export function sendEmpty(res: ServerResponse, status: number): void {
  res.writeHead(status).end();
}

/** Writes a chunk, waiting while the client reads slower than we produce. */
export async function write(res: ServerResponse, chunk: Uint8Array | string): Promise<void> {
  if (res.destroyed) throw errors.unavailable("the client went away");
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

export { DecodeErrors };
