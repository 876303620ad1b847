import type { IncomingMessage } from "node:http";
import type { DescMethod } from "@bufbuild/protobuf";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { WebSocketServer, type WebSocket } from "ws";
import type { Call } from "../../call/call.ts";
import type { CallChain } from "../../call/chain.ts";
import { SDK_VERSION_PROTOCOL, type UpgradeCall, type UpgradeRoute } from "../../gateway/rest-route.ts";
import type { AgentLocator } from "../agent-locator.ts";
import { chainCaller, type ToolboxCaller } from "./call.ts";
import { TOOLBOX_SCOPE } from "../mount.ts";
import { createConnectRequest, PTY_EXIT_CONTROL, servePty } from "./pty.ts";
import type { ToolboxRoute } from "./routes.ts";
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
  /** The method whose rule the caller is admitted under. */
  method: DescMethod;
  /**
   * Before the upgrade (so a refusal keeps its HTTP status): checks the caller and that the
   * target exists; returns the session the connection serves.
   */
  check(caller: ToolboxCaller, r: WsRequest): Promise<string>;
  serve(ws: WebSocket, caller: ToolboxCaller, r: WsRequest, target: string): Promise<void>;
}

const ids = (p: Record<string, string>) => ({ sessionId: p.session_id, commandId: p.command_id });

const ptyRoute = (method: DescMethod, check: WsRoute["check"]): WsRoute => ({
  method,
  check,
  serve: (ws, caller, r, sessionId) => servePty(ws, caller, sessionId, r.offered.includes(PTY_EXIT_CONTROL)),
});

const WS_ROUTES: Array<ToolboxRoute<WsRoute>> = [
  {
    verb: "GET",
    path: "/process/session/{session_id}/command/{command_id}/logs",
    handle: {
      method: ProcessService.method.getSessionCommand,
      check: async (caller, r) => (await caller.unary(ProcessService.method.getSessionCommand, ids(r.params))).id,
      serve: serveLogs,
    },
  },
  {
    verb: "GET",
    path: "/process/pty/{session_id}/connect",
    handle: ptyRoute(PtyService.method.getPty, async (caller, r) => (await caller.unary(PtyService.method.getPty, { sessionId: r.params.session_id })).id),
  },
  {
    verb: "GET",
    path: "/process/pty/create-connect",
    handle: ptyRoute(PtyService.method.createPty, async (caller, r) => {
      const { input, problems } = createConnectRequest(r.query, r.offered);
      return (await caller.unary(PtyService.method.createPty, input, problems)).sessionId;
    }),
  },
];

/** The WebSocket paths under each toolbox prefix (the bad-input sweep reads them). */
export const TOOLBOX_WS_PATHS = WS_ROUTES.map((r) => r.path);

/**
 * WebSockets on the toolbox prefixes: command log following and PTY terminals, for the SDKs that
 * reach them through the preview URL of port 2280 (which points at the toolbox prefix) or the
 * toolbox proxy URL. Callers authenticate as on every other route (the guard, through the
 * secured implementations), or, without credentials, with the sandbox's preview token, which the
 * locator checks (see callerFor). The routes are entries of the gateway's table; a refusal before the handshake
 * is answered by the gateway with its HTTP status.
 */
export class ToolboxWebSockets {
  private readonly wss: WebSocketServer;
  private readonly chain: CallChain;
  private readonly locator: AgentLocator;

  constructor(opts: { chain: CallChain; locator: AgentLocator }) {
    this.chain = opts.chain;
    this.locator = opts.locator;
    this.wss = new WebSocketServer({
      noServer: true,
      maxPayload: 1024 * 1024,
      // Browsers send the SDK version as a subprotocol and the reference echoes it; otherwise
      // one of the tokens the SDKs offer is selected (a client that offers some needs one back).
      handleProtocols: (offered) => [...offered].find((p) => p.startsWith(SDK_VERSION_PROTOCOL)) ?? [...offered].find((p) => p === PTY_EXIT_CONTROL) ?? false,
    });
  }

  /** The WebSocket routes under every toolbox prefix. */
  routes(prefixes: string[]): UpgradeRoute[] {
    return prefixes.flatMap((prefix) => WS_ROUTES.map(({ path, handle }): UpgradeRoute => ({ template: prefix + path, accept: (call) => this.accept(handle, call) })));
  }

  private async accept(handle: WsRoute, { req, socket, head, params, query, signal, call }: UpgradeCall): Promise<void> {
    const offered = String(req.headers["sec-websocket-protocol"] ?? "").split(",").map((p) => p.trim()).filter(Boolean);
    const r: WsRequest = { req, params, query, offered };
    const caller = await this.callerFor(handle.method, req, query, call, signal);
    const target = await handle.check(caller, r);
    if (socket.destroyed) return;
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      ws.on("error", () => ws.terminate());
      handle.serve(ws, caller, r, target).catch((err: unknown) => closeWith(ws, 1011, messageOf(err)));
    });
  }

  /** Closes every open toolbox WebSocket (server going away). */
  close(): void {
    for (const ws of this.wss.clients) closeWith(ws, 1001, "server shutting down");
    this.wss.close();
  }

  /**
   * With credentials, the guard decides (a preview token beside them lifts nothing). Without, the
   * preview token alone: the official clients (0.111 and 0.218) in browsers, Deno and serverless
   * runtimes cannot put a key on a WebSocket and send only `?DAYTONA_SANDBOX_AUTH_KEY=` (in Node
   * they send their key too). That is sound only because the token is handed out to holders of
   * the toolbox's scope alone: the preview URL routes require write:sandboxes (sandbox.proto).
   */
  private async callerFor(method: DescMethod, req: IncomingMessage, query: URLSearchParams, call: Call, signal: AbortSignal): Promise<ToolboxCaller> {
    const header = req.headers[PREVIEW_TOKEN_HEADER];
    const token = (Array.isArray(header) ? header[0] : header) || query.get(PREVIEW_TOKEN_QUERY);
    if (!req.headers.authorization && token && this.locator.previewToken) {
      const { organizationId } = await this.locator.previewToken(call.sandboxId ?? "", token);
      this.chain.grant(call, method, { organizationId, permissions: new Set([TOOLBOX_SCOPE]) });
    }
    return chainCaller(this.chain, call, signal);
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
