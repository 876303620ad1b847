import type { IncomingMessage, ServerResponse } from "node:http";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { errors } from "@sandbar/protocol";
import { DecodeErrors, messageFromJson, readJsonBody } from "../../gateway/rest-route.ts";
export { requestSignal, sendJson } from "../../gateway/rest-route.ts";

/**
 * Decodes a JSON request body into a message as the gateway does; problems are collected in
 * `errs` (and raised after the guard). An empty body is an empty message.
 */
export async function readJsonMessage<D extends DescMessage>(req: IncomingMessage, desc: D, errs: DecodeErrors): Promise<MessageShape<D>> {
  const json = await readJsonBody(req, errs);
  return messageFromJson(desc, json, errs) as MessageShape<D>;
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
