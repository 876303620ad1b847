import type { IncomingHttpHeaders } from "node:http";
import type { Route } from "@sandbar/protocol";
import type { DescMethod } from "@bufbuild/protobuf";
import { createContextKey, createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { AuthContext, Principal } from "../auth/principal.ts";
import type { Figures } from "../limits/figures.ts";
import { clientAddress } from "../server/client-address.ts";

/**
 * One request, whatever way it came in: made once by its entry point's adapter, then filled in by
 * the chain (chain.ts) as it passes each step. Every method a request invokes (a toolbox WebSocket
 * makes several) shares it, so the caller is authenticated and counted once per request.
 */
export interface Call {
  /** The request's headers (credentials, organization, client version). */
  readonly header: Headers;
  /** The client's address: anonymous calls and failed authentications are counted by it; audit records it. */
  readonly address: string;
  /** The sandbox a toolbox call is for: the REST path's, or an RPC's `x-sandbar-sandbox-id` metadata. */
  readonly sandboxId?: string;
  /** Who the credentials name: set by the chain's authentication, once. */
  principal?: Principal;
  /** What the chain admitted the request as, and for which route's rule. */
  admission?: { route: Route; auth: AuthContext };
  /** Counted against its rate limit (once per request), and where it stands: set by the chain. */
  counted?: boolean;
  figures?: Figures;
}

/** The metadata naming the sandbox of a toolbox call made over gRPC/Connect (REST has it in the path). */
export const SANDBOX_ID_HEADER = "x-sandbar-sandbox-id";

/** What an adapter knows of a request. */
export interface CallSource {
  headers: IncomingHttpHeaders;
  socket?: { remoteAddress?: string };
}

/** The call of an HTTP request (REST, WebSocket, gRPC, Connect, preview): its headers, its client's address, the sandbox it names. */
export function newCall(req: CallSource, sandboxId?: string): Call {
  const header = headersOf(req.headers);
  return { header, address: clientAddress(req), sandboxId: sandboxId ?? header.get(SANDBOX_ID_HEADER) ?? undefined };
}

/** Node's request headers as fetch Headers (repeated ones joined, as Connect does). */
function headersOf(headers: IncomingHttpHeaders): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || k.startsWith(":")) continue;
    try {
      h.set(k, Array.isArray(v) ? v.join(", ") : v);
    } catch {
      // A value fetch's Headers refuses is not one the chain reads.
    }
  }
  return h;
}

/** The call a handler serves (adapters put it on the context they make; calls without one have no caller). */
export const callKey = createContextKey<Call | undefined>(undefined);

/**
 * Decoding problems an adapter found in this invocation's input (REST query, path, body). The
 * chain raises them after authentication, so a caller without credentials learns nothing about
 * the input rules (401 before 400).
 */
export const inputProblemsKey = createContextKey<readonly string[]>([]);

/**
 * The one factory of handler contexts for invocations that do not come through Connect's router
 * (REST, WebSockets, the preview proxy): one per invocation, all of a request's sharing its Call.
 * The adapter keeps it to read the response headers the implementation set.
 */
export function contextFor(call: Call, method: DescMethod, signal: AbortSignal, problems: readonly string[] = [], protocolName = "rest"): HandlerContext {
  return createHandlerContext({
    service: method.parent,
    method,
    protocolName,
    requestMethod: "POST",
    url: `/${method.parent.typeName}/${method.name}`,
    requestHeader: call.header,
    requestSignal: signal,
    contextValues: createContextValues().set(callKey, call).set(inputProblemsKey, problems),
  });
}

const NO_CALLER: AuthContext = {};

/** What the chain admitted the call as (empty before admission, and for public routes). */
export function authOf(ctx: HandlerContext): AuthContext {
  return ctx.values.get(callKey)?.admission?.auth ?? NO_CALLER;
}

export function callerOf(ctx: HandlerContext): Principal {
  const principal = authOf(ctx).principal;
  if (!principal) throw errors.unauthenticated();
  return principal;
}

export function organizationOf(ctx: HandlerContext): string {
  const org = authOf(ctx).organizationId;
  if (!org) throw errors.permissionDenied("Invalid authentication context");
  return org;
}
