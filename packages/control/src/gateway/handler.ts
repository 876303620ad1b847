import type { IncomingMessage, ServerResponse } from "node:http";
import { STATUS_CODES } from "node:http";
import { create, type DescField, type DescMethod, type Message } from "@bufbuild/protobuf";
import { createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { asConnectError, errors, httpStatusOf } from "@sandbar/protocol";
import { DecodeErrors, messageFromJson, messageToJson, setField, valueToJson } from "./json.ts";
import type { RestRoute, RouteTable } from "./route-table.ts";
import { inputProblemsKey, precheck, type Precheck } from "../rpc/secure.ts";
import { readJsonBody, requestSignal, sendJson, statusOverride } from "./http-io.ts";
import { SANDBOX_ID_HEADER } from "../toolbox/forward.ts";
import { textProblems } from "../services/validate.ts";

type Impl = (input: unknown, ctx: HandlerContext) => unknown;
/** Secured implementations by service type name and method local name (and their precheck, see secure()). */
export type ImplIndex = Map<string, Record<string, Impl | undefined> & { [precheck]?: Precheck }>;


/**
 * Hook for routes the generic mapping cannot serve (the toolbox's multipart and raw-stream
 * routes): given the verb and the path below the base, a handler that takes the request before
 * the route table, or undefined. Its handlers call the same secured implementations, and what
 * they throw is answered like any gateway error.
 */
export type GatewayIntercept = (verb: string, path: string) => ((req: IncomingMessage, res: ServerResponse) => Promise<void>) | undefined;

/**
 * The REST gateway: maps the documented paths and statuses onto the same (secured) service
 * implementations the RPC router serves. Errors use the reference's body
 * {path, timestamp, statusCode, error, message}.
 */
export function createGateway(table: RouteTable, impls: ImplIndex, basePath: string, intercept?: GatewayIntercept) {
  return async (req: IncomingMessage, res: ServerResponse) => {
    const url = req.url ?? "/";
    try {
      cors(req, res);
      if (req.method === "OPTIONS") return void res.writeHead(204).end();
      const q = url.indexOf("?");
      const pathname = q < 0 ? url : url.slice(0, q);
      const searchParams = new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
      const verb = req.method ?? "GET";
      const path = pathname.slice(basePath.length) || "/";
      const special = intercept?.(verb, path);
      if (special) return await special(req, res);
      let match;
      try {
        match = table.match(verb === "HEAD" ? "GET" : verb, path);
      } catch {
        throw errors.invalidArgument("Malformed URL encoding in path");
      }
      if (!match) throw errors.notFound(`Cannot ${verb} ${pathname}`);
      const { route, params } = match;
      const impl = impls.get(route.service.typeName)?.[route.method.localName];
      if (!impl) throw errors.unimplemented(`${verb} ${basePath}${route.template} is not implemented yet`);
      // A body is read only for a caller that may make the call (401/403 before 413 or 400).
      if (route.body) await impls.get(route.service.typeName)?.[precheck]?.(route.method, headersOf(req), partialInput(route, params, searchParams));
      const errs = new DecodeErrors();
      const input = await readInput(req, route, params, searchParams, errs);
      // A sandbox in the path that the message has no field for routes the call (the toolbox);
      // one that cannot be a header value is an input problem.
      if (params.sandbox_id !== undefined && !fieldNamed(route.method, "sandbox_id")) {
        const problems = textProblems("sandbox_id", "sandboxId", params.sandbox_id);
        if (problems.length) problems.forEach((p) => errs.add(p));
        else req.headers[SANDBOX_ID_HEADER] = params.sandbox_id;
      }
      const ctx = handlerContext(req, res, route, url, errs.messages);
      if (route.method.methodKind === "server_streaming") return await stream(res, route, impl(input, ctx) as AsyncIterable<unknown>, ctx);
      if (route.method.methodKind !== "unary") throw errors.unimplemented(`${route.method.name} is not available over REST`);
      const output = create(route.method.output, (await impl(input, ctx)) as never) as Message;
      send(res, route, output, ctx, wholePage(route, req, searchParams));
    } catch (err) {
      sendError(res, url, err);
    }
  };
}

/** Builds the request message from body, query and path; problems go to `errs`, raised after the guard. */
async function readInput(req: IncomingMessage, route: RestRoute, params: Record<string, string>, query: URLSearchParams, errs: DecodeErrors): Promise<Message> {
  const desc = route.method.input;
  let msg: Record<string, unknown>;
  const json = route.body ? await readJsonBody(req, errs) : undefined;
  if (route.body === "*") {
    msg = messageFromJson(desc, json, errs) as unknown as Record<string, unknown>;
  } else {
    msg = create(desc) as unknown as Record<string, unknown>;
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
  return msg as unknown as Message;
}

/** The request as far as the path and the query give it (what the guard reads: the organization). */
function partialInput(route: RestRoute, params: Record<string, string>, query: URLSearchParams): Message {
  const msg = create(route.method.input) as unknown as Record<string, unknown>;
  const ignored = new DecodeErrors();
  for (const [name, value] of [...query.entries(), ...Object.entries(params)]) {
    const field = fieldNamed(route.method, name);
    if (field && field.fieldKind === "scalar") setField(msg, field, value, "text", ignored);
  }
  return msg as unknown as Message;
}

/** Node's request headers as fetch Headers (repeated ones joined, as Connect does). */
export function headersOf(req: { headers: IncomingMessage["headers"] }): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined || k.startsWith(":")) continue;
    try {
      h.set(k, Array.isArray(v) ? v.join(", ") : v);
    } catch {
      // A value fetch's Headers refuses is not one the guard reads.
    }
  }
  return h;
}

function fieldNamed(method: DescMethod, name: string): DescField | undefined {
  return method.input.fields.find((f) => f.name === name || f.jsonName === name);
}

function handlerContext(req: IncomingMessage, res: ServerResponse, route: RestRoute, url: string, problems: string[]): HandlerContext {
  // Node joins repeated request headers into one string (set-cookie aside), so the object maps straight to Headers.
  const requestHeader = req.headers as Record<string, string>;
  return createHandlerContext({
    service: route.service,
    method: route.method,
    protocolName: "rest",
    requestMethod: req.method ?? "GET",
    url,
    requestHeader,
    requestSignal: requestSignal(res),
    contextValues: createContextValues().set(inputProblemsKey, problems),
  });
}

function copyHeaders(res: ServerResponse, ctx: HandlerContext) {
  ctx.responseHeader.forEach((value, key) => res.setHeader(key, value));
}

/**
 * Cursor-paginated lists answer a bare array to the clients that predate cursors, and the whole
 * page ({items, nextCursor}) to those that paginate: a `cursor` or `limit` in the query, or a
 * client that says it is 0.180 or newer (whose first request carries neither).
 */
function wholePage(route: RestRoute, req: IncomingMessage, query: URLSearchParams): boolean {
  if (!route.responseBody || !route.method.output.fields.some((f) => f.name === "next_cursor")) return false;
  if (query.has("cursor") || query.has("limit")) return true;
  const version = /^(\d+)\.(\d+)/.exec(String(req.headers["x-daytona-sdk-version"] ?? ""));
  return version !== null && (Number(version[1]) > 0 || Number(version[2]) >= 180);
}

function send(res: ServerResponse, route: RestRoute, output: Message, ctx: HandlerContext, whole = false) {
  copyHeaders(res, ctx);
  if (route.method.output.typeName === "google.protobuf.Empty") return void res.writeHead(route.status).end();
  const opts = { omitUnset: route.omitUnset };
  const field = route.responseBody && !whole ? route.method.output.fields.find((f) => f.name === route.responseBody) : undefined;
  const body = field
    ? valueToJson(field, (output as unknown as Record<string, unknown>)[field.localName], opts)
    : messageToJson(route.method.output, output, opts);
  sendJson(res, route.status, body);
}

/** Server streams: a string/bytes response_body is written raw; otherwise one JSON object per line. */
async function stream(res: ServerResponse, route: RestRoute, messages: AsyncIterable<unknown>, ctx: HandlerContext) {
  const field = route.responseBody ? route.method.output.fields.find((f) => f.name === route.responseBody) : undefined;
  const raw = field?.fieldKind === "scalar";
  const iterator = messages[Symbol.asyncIterator]();
  // Pull the first message before committing to 200, so an early error still gets its status.
  let next = await iterator.next();
  copyHeaders(res, ctx);
  res.writeHead(route.status, { "content-type": raw ? "text/plain; charset=utf-8" : "application/x-ndjson" });
  while (!next.done && !res.destroyed) {
    const msg = create(route.method.output, next.value as never) as unknown as Record<string, unknown>;
    const chunk = raw ? (msg[field!.localName] as string | Uint8Array) : JSON.stringify(messageToJson(route.method.output, msg as unknown as Message, { omitUnset: route.omitUnset })) + "\n";
    if (!res.write(chunk)) await new Promise((r) => res.once("drain", r));
    next = await iterator.next();
  }
  res.end();
}

export function sendError(res: ServerResponse, path: string, err: unknown) {
  const e = asConnectError(err);
  const statusCode = statusOverride(e) ?? httpStatusOf(e.code);
  if (res.headersSent) return void res.destroy();
  sendJson(res, statusCode, {
    path,
    timestamp: new Date().toISOString(),
    statusCode,
    error: STATUS_CODES[statusCode] ?? "Error",
    message: e.rawMessage,
  });
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
