import type { IncomingMessage, ServerResponse } from "node:http";
import { errors } from "@sandbar/protocol";
import type { DecodeErrors } from "./json.ts";

/** JSON request bodies are small; uploads stream through their own routes. */
const MAX_JSON_BODY = 10 * 1024 * 1024;

/** The request's JSON body (undefined when empty); malformed JSON is a problem in `errs`, raised after the guard. */
export async function readJsonBody(req: IncomingMessage, errs: DecodeErrors): Promise<unknown> {
  const text = await readBody(req);
  if (text.trim() === "") return undefined;
  try {
    return JSON.parse(text);
  } catch {
    errs.add("Invalid JSON in request body");
    return undefined;
  }
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

/** Aborted when the client goes away before the response is finished (a finished one needs no abort: it is not free). */
export function requestSignal(res: ServerResponse): AbortSignal {
  const abort = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort.signal;
}

/** A JSON response with its length. */
export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
