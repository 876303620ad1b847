import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { create, type DescField, type DescMessage, type DescMethod, type Message } from "@bufbuild/protobuf";
import { reflect } from "@bufbuild/protobuf/reflect";
import type { HandlerContext } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { type Call, contextFor, newCall } from "../call/call.ts";
import type { CallChain } from "../call/chain.ts";
import { writeFigures } from "../limits/figures.ts";
import { textProblems } from "../services/validate.ts";
import { clientBefore, clientVersion } from "./client-version.ts";
import { refuse, sendError } from "./error-answer.ts";
import { readJsonBody, requestSignal, sendJson, upgradeRequired, write } from "./http-io.ts";
import { DecodeErrors, fieldToJson, messageFromJson, messageToJson, setField } from "./json.ts";
import type { RestRoute, RouteTable } from "./route-table.ts";

export interface Gateway {
  /** Serves a request below the base path. */
  handle(req: IncomingMessage, res: ServerResponse): Promise<void>;
  /** For the HTTP/1.1 server's upgrade event: true when a WebSocket route took the request. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean;
}

/**
 * The REST gateway, the chain's adapter for HTTP: one route table, whose entries are the
 * contract's routes (invoked through the call chain like every RPC) or routes written by hand;
 * errors rendered by error-answer.ts, for HTTP answers and refused WebSocket upgrades alike.
 */
export function createGateway(table: RouteTable, chain: CallChain, basePath: string): Gateway {
  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? "/";
    let call: Call | undefined;
    let ctx: HandlerContext | undefined;
    try {
      cors(req, res);
      const { path, query } = splitUrl(url, basePath);
      const verb = req.method ?? "GET";
      // Preflights are answered here, unless a route takes OPTIONS itself (the preview proxy's path form).
      if (verb === "OPTIONS" && table.match(verb, path)?.kind !== "handwritten") return void res.writeHead(204).end();
      const match = table.match(verb === "HEAD" ? "GET" : verb, path);
      // A path only a WebSocket serves (no plain route of its own), asked for without the
      // handshake: over HTTP/2, or HTTP/1.1 without Upgrade. The answer says so rather than 404.
      const ws = verb === "GET" ? table.matchUpgrade(path) : undefined;
      if (ws && ws.route.template !== match?.route.template) {
        // Over HTTP/1.1 it names the upgrade to ask for (RFC 9110 15.5.22); HTTP/2 has no Upgrade header.
        if (req.httpVersionMajor === 1) res.setHeader("upgrade", "websocket").setHeader("connection", "Upgrade");
        throw upgradeRequired(`${basePath}${path}`);
      }
      if (!match || match.kind === "upgrade") throw errors.notFound(`Cannot ${verb} ${basePath}${path}`);
      const signal = requestSignal(res);
      if (match.kind === "handwritten") {
        call = newCall(req, match.params.sandbox_id);
        // The caller is checked before the route reads a body (401/403 before 413 or 400).
        if (!match.route.selfAuthorized) {
          if (!(await match.route.admitsOwn?.({ req, query, call }))) await chain.admit(call, match.route.method);
          headersOnto(res, call);
        }
        return await match.route.serve({ req, res, params: match.params, query, signal, call });
      }
      const { route, params } = match;
      // A sandbox in the path that the message has no field for routes the call (the toolbox).
      const sandboxId = params.sandbox_id !== undefined && !fieldNamed(route.method, "sandbox_id") ? params.sandbox_id : undefined;
      call = newCall(req, sandboxId);
      // With a body, the caller is checked before it is read.
      if (route.body) await chain.admit(call, route.method, partialInput(route, params, query));
      const errs = new DecodeErrors();
      const input = await readInput(req, route, params, query, errs);
      if (sandboxId !== undefined) textProblems("sandbox_id", "sandboxId", sandboxId).forEach((p) => errs.add(p));
      ctx = contextFor(call, route.method, signal, errs.messages);
      if (route.method.methodKind === "server_streaming") return await stream(res, route, chain.stream(ctx, input), ctx, call);
      if (route.method.methodKind !== "unary") throw errors.unimplemented(`${route.method.name} is not available over REST`);
      const output = await chain.unary(ctx, input);
      send(res, route, output, ctx, call, wholePage(route, req, query));
    } catch (err) {
      // The call's headers and rate-limit figures stay on its error.
      if (call && !res.headersSent) headersOnto(res, call, ctx);
      sendError(res, url, err);
    }
  }

  function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    const url = req.url ?? "/";
    if (!url.startsWith(basePath + "/")) return false;
    const { path, query } = splitUrl(url, basePath);
    let match;
    try {
      match = table.matchUpgrade(path);
    } catch (err) {
      refuse(socket, url, err);
      return true;
    }
    if (!match || match.kind !== "upgrade") return false;
    const abort = new AbortController();
    socket.on("error", () => socket.destroy());
    socket.once("close", () => abort.abort());
    const call = newCall(req, match.params.sandbox_id);
    match.route.accept({ req, socket, head, params: match.params, query, signal: abort.signal, call }).catch((err: unknown) => refuse(socket, url, err));
    return true;
  }

  return { handle, upgrade };
}

function splitUrl(url: string, basePath: string): { path: string; query: URLSearchParams } {
  const q = url.indexOf("?");
  const pathname = q < 0 ? url : url.slice(0, q);
  return { path: pathname.slice(basePath.length) || "/", query: new URLSearchParams(q < 0 ? "" : url.slice(q + 1)) };
}

/** Builds the request message from body, query and path; problems go to `errs`, raised after the guard. */
async function readInput(req: IncomingMessage, route: RestRoute, params: Record<string, string>, query: URLSearchParams, errs: DecodeErrors): Promise<Message> {
  const desc = route.method.input;
  let msg: Message;
  const json = route.body ? await readJsonBody(req, errs) : undefined;
  if (route.body === "*") {
    msg = messageFromJson(desc, json, errs);
  } else {
    msg = create(desc);
    const field = route.body ? desc.fields.find((f) => f.name === route.body) : undefined;
    if (field && json !== undefined && json !== null) setField(msg, field, json, "json", errs);
  }
  const bound = new Set(Object.keys(params));
  for (const key of new Set(query.keys())) {
    const name = key.endsWith("[]") ? key.slice(0, -2) : key;
    const field = fieldNamed(route.method, name);
    if (!field || bound.has(field.name)) continue;
    const values = query.getAll(key);
    setField(msg, field, field.fieldKind === "list" ? values : values[values.length - 1], "text", errs);
  }
  for (const [name, value] of Object.entries(params)) {
    const field = fieldNamed(route.method, name);
    if (field) setField(msg, field, value, "text", errs);
  }
  return msg;
}

/** The request as far as the path and the query give it (what the guard reads: the organization). */
function partialInput(route: RestRoute, params: Record<string, string>, query: URLSearchParams): Message {
  const msg = create(route.method.input);
  const ignored = new DecodeErrors();
  for (const [name, value] of [...query.entries(), ...Object.entries(params)]) {
    const field = fieldNamed(route.method, name);
    if (field && field.fieldKind === "scalar") setField(msg, field, value, "text", ignored);
  }
  return msg;
}

function fieldNamed(method: DescMethod, name: string): DescField | undefined {
  return method.input.fields.find((f) => f.name === name || f.jsonName === name);
}

/** The headers the implementation set and the call's rate-limit figures, on its response. */
function headersOnto(res: ServerResponse, call: Call, ctx?: HandlerContext) {
  ctx?.responseHeader.forEach((value, key) => res.setHeader(key, value));
  if (call.figures) writeFigures(call.figures, (k, v) => res.setHeader(k, v));
}

/**
 * Cursor-paginated lists answer a bare array to the clients that predate cursors, and the whole
 * page ({items, nextCursor}) to those that paginate: a `cursor` or `limit` in the query, or a
 * client that says it is 0.180 or newer (whose first request carries neither).
 */
function wholePage(route: RestRoute, req: IncomingMessage, query: URLSearchParams): boolean {
  if (!route.responseBody || !route.method.output.fields.some((f) => f.name === "next_cursor")) return false;
  if (query.has("cursor") || query.has("limit")) return true;
  return clientVersion(req.headers).sent && !clientBefore(req.headers, [0, 180, 0]);
}

function send(res: ServerResponse, route: RestRoute, output: Message, ctx: HandlerContext, call: Call, whole = false) {
  // The call's headers go in with writeHead (one step, instead of a setHeader each: every call has six rate-limit figures).
  const headers: Record<string, string> = {};
  ctx.responseHeader.forEach((value, key) => (headers[key] = value));
  if (call.figures) writeFigures(call.figures, (k, v) => (headers[k] = v));
  if (route.method.output.typeName === "google.protobuf.Empty") return void res.writeHead(route.status, headers).end();
  const opts = { omitUnset: route.omitUnset };
  const field = route.responseBody && !whole ? route.method.output.fields.find((f) => f.name === route.responseBody) : undefined;
  const body = field
    ? fieldToJson(route.method.output, output, field, opts)
    : messageToJson(route.method.output, output, opts);
  sendJson(res, route.status, body, headers);
}

/** A string or bytes field's value, written as it is. */
function rawChunk(desc: DescMessage, msg: Message, field: DescField): string | Uint8Array {
  const value = reflect(desc, msg).get(field);
  return typeof value === "string" || value instanceof Uint8Array ? value : String(value);
}

/** Server streams: a string/bytes response_body is written raw; otherwise one JSON object per line. */
async function stream(res: ServerResponse, route: RestRoute, messages: AsyncIterable<Message>, ctx: HandlerContext, call: Call) {
  const field = route.responseBody ? route.method.output.fields.find((f) => f.name === route.responseBody) : undefined;
  const raw = field?.fieldKind === "scalar" ? field : undefined;
  const iterator = messages[Symbol.asyncIterator]();
  // Pull the first message before committing to 200, so an early error still gets its status.
  let next = await iterator.next();
  headersOnto(res, call, ctx);
  res.writeHead(route.status, { "content-type": raw ? "text/plain; charset=utf-8" : "application/x-ndjson" });
  try {
    while (!next.done) {
      const chunk = raw ? rawChunk(route.method.output, next.value, raw) : JSON.stringify(messageToJson(route.method.output, next.value, { omitUnset: route.omitUnset })) + "\n";
      await write(res, chunk);
      next = await iterator.next();
    }
  } catch (err) {
    // The client went away (or the stream failed after the 200): the call is ended, not left waiting.
    await iterator.return?.().catch(() => undefined);
    throw err;
  }
  res.end();
}

function cors(req: IncomingMessage, res: ServerResponse) {
  const origin = req.headers.origin;
  if (!origin) return;
  res.setHeader("access-control-allow-origin", origin);
  res.setHeader("vary", "Origin");
  if (req.method === "OPTIONS") {
    res.setHeader("access-control-allow-methods", "GET,HEAD,PUT,PATCH,POST,DELETE,OPTIONS");
    res.setHeader("access-control-allow-headers", req.headers["access-control-request-headers"] ?? "*");
    res.setHeader("access-control-max-age", "600");
  }
}
