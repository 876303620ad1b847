import type { IncomingMessage } from "node:http";
import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { asConnectError, httpStatusOf } from "@sandbar/protocol";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { WebSocketServer, type WebSocket } from "ws";
import type { ImplIndex } from "../../gateway/handler.ts";
import type { AgentClients } from "../agent-clients.ts";
import type { AgentLocator } from "../agent-locator.ts";
import { agentCaller, guardedCaller, type ToolboxCaller } from "./call.ts";
import { createConnectRequest, PTY_EXIT_CONTROL, servePty } from "./pty.ts";
import { SpecialRoutes, type SpecialRoute } from "./routes.ts";
import { SDK_VERSION_PROTOCOL } from "./sdk-version.ts";
import { logChunks } from "./sessions.ts";
import { closeWith, messageOf, sendFrame } from "./ws-frames.ts";

/** The preview token header the SDKs send on WebSockets, and the query parameter browsers use instead. */
const PREVIEW_TOKEN_HEADER = "x-daytona-preview-token";
const PREVIEW_TOKEN_QUERY = "DAYTONA_SANDBOX_AUTH_KEY";

interface WsRequest {
  req: IncomingMessage;
  params: Record<string, string>;
  query: URLSearchParams;
  /** The subprotocols the client offered. */
  offered: string[];
}

interface WsRoute {
  /**
   * Before the upgrade (so a refusal keeps its HTTP status): checks the caller and that the
   * target exists; returns the session the connection serves.
   */
  check(caller: ToolboxCaller, r: WsRequest): Promise<string>;
  serve(ws: WebSocket, caller: ToolboxCaller, r: WsRequest, target: string): Promise<void>;
}

const ids = (p: Record<string, string>) => ({ sessionId: p.session_id, commandId: p.command_id });

const ptyRoute = (check: WsRoute["check"]): WsRoute => ({
  check,
  serve: (ws, caller, r, sessionId) => servePty(ws, caller, sessionId, r.offered.includes(PTY_EXIT_CONTROL)),
});

const WS_ROUTES: Array<SpecialRoute<WsRoute>> = [
  {
    verb: "GET",
    path: "/process/session/{session_id}/command/{command_id}/logs",
    handle: {
      check: async (caller, r) => (await caller.unary(ProcessService.method.getSessionCommand, ids(r.params))).id,
      serve: serveLogs,
    },
  },
  {
    verb: "GET",
    path: "/process/pty/{session_id}/connect",
    handle: ptyRoute(async (caller, r) => (await caller.unary(PtyService.method.getPty, { sessionId: r.params.session_id })).id),
  },
  {
    verb: "GET",
    path: "/process/pty/create-connect",
    handle: ptyRoute(async (caller, r) => (await caller.unary(PtyService.method.createPty, createConnectRequest(r.query, r.offered))).sessionId),
  },
];

/**
 * WebSockets on the toolbox prefixes: command log following and PTY terminals, for the SDKs that
 * reach them through the preview URL of port 2280 (which points at the toolbox prefix) or the
 * toolbox proxy URL. Callers authenticate as on every other route (the guard, through the
 * secured implementations), or, without credentials, with the sandbox's preview token, which the
 * locator checks.
 */
export class ToolboxWebSockets {
  private readonly wss: WebSocketServer;
  private readonly routes: SpecialRoutes<WsRoute>;
  private readonly impls: ImplIndex;
  private readonly locator: AgentLocator;
  private readonly clients: AgentClients;
  private readonly basePath: string;

  constructor(opts: { impls: ImplIndex; locator: AgentLocator; clients: AgentClients; basePath: string; prefixes: string[] }) {
    this.impls = opts.impls;
    this.locator = opts.locator;
    this.clients = opts.clients;
    this.basePath = opts.basePath;
    this.routes = new SpecialRoutes(opts.prefixes, WS_ROUTES);
    this.wss = new WebSocketServer({
      noServer: true,
      maxPayload: 1024 * 1024,
      // Browsers send the SDK version as a subprotocol and the reference echoes it; otherwise
      // one of the tokens the SDKs offer is selected (a client that offers some needs one back).
      handleProtocols: (offered) => [...offered].find((p) => p.startsWith(SDK_VERSION_PROTOCOL)) ?? [...offered].find((p) => p === PTY_EXIT_CONTROL) ?? false,
    });
  }

  /** Takes an upgrade request on a toolbox WebSocket path; false when the path is not one. */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const pathname = q < 0 ? url : url.slice(0, q);
    if (!pathname.startsWith(this.basePath + "/")) return false;
    let match;
    try {
      match = this.routes.match(req.method ?? "GET", pathname.slice(this.basePath.length));
    } catch (err) {
      refuse(socket, pathname, err);
      return true;
    }
    if (!match) return false;
    const { handle, params } = match;
    const query = new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
    const offered = String(req.headers["sec-websocket-protocol"] ?? "").split(",").map((p) => p.trim()).filter(Boolean);
    const r: WsRequest = { req, params, query, offered };
    const abort = new AbortController();
    socket.on("error", () => socket.destroy());
    socket.once("close", () => abort.abort());
    void (async () => {
      let caller: ToolboxCaller;
      let target: string;
      try {
        caller = await this.callerFor(req, query, params.sandbox_id, abort.signal);
        target = await handle.check(caller, r);
      } catch (err) {
        return refuse(socket, pathname, err);
      }
      if (socket.destroyed) return;
      this.wss.handleUpgrade(req, socket, head, (ws) => {
        ws.on("error", () => ws.terminate());
        handle.serve(ws, caller, r, target).catch((err: unknown) => closeWith(ws, 1011, messageOf(err)));
      });
    })();
    return true;
  }

  /** Closes every open toolbox WebSocket (server going away). */
  close(): void {
    for (const ws of this.wss.clients) closeWith(ws, 1001, "server shutting down");
    this.wss.close();
  }

  private async callerFor(req: IncomingMessage, query: URLSearchParams, sandboxId: string, signal: AbortSignal): Promise<ToolboxCaller> {
    const header = req.headers[PREVIEW_TOKEN_HEADER];
    const token = (Array.isArray(header) ? header[0] : header) || query.get(PREVIEW_TOKEN_QUERY);
    if (!req.headers.authorization && token && this.locator.previewToken) {
      const agent = await this.locator.previewToken(sandboxId, token);
      return agentCaller(this.clients, this.locator, agent, signal);
    }
    return guardedCaller(this.impls, req, sandboxId, signal);
  }
}

/**
 * Command logs as binary frames of the log's bytes from its start (markers kept or stripped by
 * the client's version); with follow=true until the command has exited and its output is
 * drained. Then close 1000. Client frames are ignored.
 */
async function serveLogs(ws: WebSocket, caller: ToolboxCaller, r: WsRequest): Promise<void> {
  const abort = new AbortController();
  ws.once("close", () => abort.abort());
  try {
    for await (const chunk of logChunks(caller, ids(r.params), r.query.get("follow") === "true", r.req.headers)) {
      if (abort.signal.aborted) return;
      await sendFrame(ws, chunk);
    }
    closeWith(ws, 1000, "");
  } catch (err) {
    if (!abort.signal.aborted) closeWith(ws, 1011, messageOf(err));
  }
}

/** Answers an upgrade request with an HTTP error, in the gateway's error body. */
function refuse(socket: Duplex, path: string, err: unknown): void {
  if (socket.destroyed) return;
  const e = asConnectError(err);
  const statusCode = httpStatusOf(e.code);
  const reason = STATUS_CODES[statusCode] ?? "Error";
  const body = JSON.stringify({ path, timestamp: new Date().toISOString(), statusCode, error: reason, message: e.rawMessage });
  socket.end(
    `HTTP/1.1 ${statusCode} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
