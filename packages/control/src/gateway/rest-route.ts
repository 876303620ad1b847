import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { DescMethod } from "@bufbuild/protobuf";
import type { Call } from "../call/call.ts";

// What the gateway offers routes it cannot map from the contract (multipart, raw streams,
// WebSockets): they are entries of its one route table, get the request's Call from the gateway
// (admitted by the chain before they read a body), and have their errors rendered by the gateway
// like any other route's.

/** One HTTP request as a hand-written route serves it. */
interface RestCall {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
  /** The request's call, admitted already (unless the route is selfAuthorized): invoke methods through the chain with it. */
  call: Call;
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
  /**
   * A credential of the route's own in the request (a signed file URL's signature): the route
   * admits the call through the chain itself and says true; false leaves the chain's usual check.
   */
  admitsOwn?(call: Pick<RestCall, "req" | "query" | "call">): Promise<boolean>;
  serve(call: RestCall): Promise<void>;
}

/** A WebSocket route: `accept` checks the request (its errors answer the upgrade with an HTTP status), then takes the socket. */
export interface UpgradeRoute {
  template: string;
  accept(call: UpgradeCall): Promise<void>;
}

/** A WebSocket request as an upgrade route takes it; `call` is not admitted yet (the route decides how its caller authenticates). */
export interface UpgradeCall {
  req: IncomingMessage;
  socket: Duplex;
  head: Buffer;
  params: Record<string, string>;
  query: URLSearchParams;
  signal: AbortSignal;
  call: Call;
}

export { clientBefore, clientVersion, SDK_VERSION_PROTOCOL } from "./client-version.ts";
export { readJsonBody, sendJson, write } from "./http-io.ts";
export { DecodeErrors, messageFromJson, messageToJson } from "./json.ts";
