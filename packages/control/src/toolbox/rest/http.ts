import type { IncomingMessage, ServerResponse } from "node:http";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { DecodeErrors, messageFromJson, readJsonBody } from "../../gateway/rest-route.ts";
export {  sendJson, write } from "../../gateway/rest-route.ts";

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

export { DecodeErrors };
