import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { DescMethod } from "@bufbuild/protobuf";
import { createContextKey, createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { inputProblemsKey, type Precheck, precheck, precheckedPrincipalKey, rateLimitCountedKey } from "../rpc/secure.ts";
import type { Principal } from "../auth/principal.ts";
import type { CallSite } from "../auth/guard.ts";
import { writeFigures } from "../limits/figures.ts";
import { clientAddress, clientAddressKey } from "../server/client-address.ts";

// What the gateway offers routes it cannot map from the contract (multipart, raw streams,
// WebSockets): they are entries of its one route table, get their call contexts from the one
// factory below, and have their errors rendered by the gateway like any other route's.

type Impl = (input: unknown, ctx: HandlerContext) => unknown;
/** Secured implementations by service type name and method local name (and their precheck, see secure()). */
export type ImplIndex = Map<string, Record<string, Impl | undefined> & { [precheck]?: Precheck }>;

/** The sandbox a toolbox call is for: from the REST path, or an RPC's `x-sandbar-sandbox-id` metadata. */
export const sandboxIdKey = createContextKey<string | undefined>(undefined);

/** One HTTP request as a hand-written route serves it. */
export interface RestCall {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
}

/** A hand-written HTTP route. The caller is checked against `method`'s rule before `serve` reads a body. */
export interface HandwrittenRoute {
  verb: string;
  template: string;
  method: DescMethod;
  /**
   * The route authorizes each request itself and is not API traffic (the preview proxy's path
   * form): the gateway neither checks nor rate-limits the caller first, as for the host form.
   */
  selfAuthorized?: boolean;
  serve(call: RestCall): Promise<void>;
}

/** A WebSocket route: `accept` checks the request (its errors answer the upgrade with an HTTP status), then takes the socket. */
export interface UpgradeRoute {
  template: string;
  accept(call: { req: IncomingMessage; socket: Duplex; head: Buffer; params: Record<string, string>; query: URLSearchParams; signal: AbortSignal }): Promise<void>;
}

/** The values a call context carries besides the request. */
export interface CallValues {
  sandboxId?: string;
  /** Input decoding problems, raised after the guard (401 before 400). */
  problems?: string[];
}

/** What a call context is made from: the HTTP request (its socket gives the client's address). */
export type CallRequest = { headers: IncomingHttpHeaders; method?: string; url?: string; socket?: { remoteAddress?: string } };

/**
 * The one factory of handler contexts for calls that arrive over REST (generic and hand-written
 * routes alike): the request's headers, its abort signal, the client's address, the sandbox and
 * input problems as typed values.
 */
export function callContext(method: DescMethod, req: CallRequest, signal: AbortSignal, values: CallValues = {}): HandlerContext {
  const contextValues = createContextValues()
    .set(inputProblemsKey, values.problems ?? [])
    .set(clientAddressKey, clientAddress(req))
    .set(rateLimitCountedKey, prechecked.has(req))
    .set(precheckedPrincipalKey, prechecked.get(req));
  if (values.sandboxId !== undefined) contextValues.set(sandboxIdKey, values.sandboxId);
  return createHandlerContext({
    service: method.parent,
    method,
    protocolName: "rest",
    requestMethod: req.method ?? "GET",
    url: req.url ?? "/",
    // Not the object itself: an HTTP/2 request's carries pseudo-headers and a symbol key, which Headers refuses.
    requestHeader: headersOf(req),
    requestSignal: signal,
    contextValues,
  });
}

/**
 * Requests the gateway's precheck counted against their rate limit and authenticated (so the
 * calls they make are neither counted nor authenticated again), with who they authenticated as.
 */
const prechecked = new WeakMap<object, Principal | undefined>();

/**
 * The gateway's check of a request before its body is read: credentials, scope and rate limit,
 * whose figures go straight onto the response (an answer or an error written later keeps them).
 */
export async function precheckRequest(impls: ImplIndex, method: DescMethod, req: IncomingMessage, res: ServerResponse, partial: unknown): Promise<void> {
  const check = impls.get(method.parent.typeName)?.[precheck];
  if (!check) return;
  const call: CallSite = { address: clientAddress(req) };
  await check(method, headersOf(req), partial, call);
  if (call.figures) writeFigures(call.figures, (k, v) => res.setHeader(k, v));
  prechecked.set(req, call.principal);
}

/** Node's request headers as fetch Headers (repeated ones joined, as Connect does). */
export function headersOf(req: { headers: IncomingHttpHeaders }): Headers {
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

export { clientBefore, clientVersion, SDK_VERSION_PROTOCOL } from "./client-version.ts";
export { readJsonBody, requestSignal, sendJson, write } from "./http-io.ts";
export { DecodeErrors, messageFromJson } from "./json.ts";
