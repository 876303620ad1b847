import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { ImplIndex } from "../../gateway/handler.ts";
import type { AgentClients } from "../agent-clients.ts";
import type { AgentLocator } from "../agent-locator.ts";
import { guardedCaller } from "./call.ts";
import { bulkDownload, singleDownload } from "./download.ts";
import { execute } from "./execute.ts";
import { requestSignal } from "./http.ts";
import { createPty } from "./pty.ts";
import { SpecialRoutes, type RestHandler, type SpecialRoute } from "./routes.ts";
import { commandLogs, createSession, sessionExec } from "./sessions.ts";
import { bulkUpload, singleUpload } from "./upload.ts";
import { ToolboxWebSockets } from "./websocket.ts";

/**
 * The toolbox routes whose wire format the generic JSON gateway cannot produce: multipart
 * uploads and downloads, raw byte streams, statuses and shapes that depend on the request
 * (SDK version, async exec), the legacy command wrapper. Paths are relative to a toolbox prefix.
 */
const ROUTES: Array<SpecialRoute<RestHandler>> = [
  { verb: "POST", path: "/files/bulk-upload", handle: bulkUpload },
  { verb: "POST", path: "/files/upload", handle: singleUpload },
  { verb: "POST", path: "/files/bulk-download", handle: bulkDownload },
  { verb: "GET", path: "/files/download", handle: singleDownload },
  { verb: "POST", path: "/process/execute", handle: execute },
  { verb: "POST", path: "/process/session", handle: createSession },
  { verb: "POST", path: "/process/session/{session_id}/exec", handle: sessionExec },
  { verb: "GET", path: "/process/session/{session_id}/command/{command_id}/logs", handle: commandLogs },
  { verb: "POST", path: "/process/pty", handle: createPty },
];

export interface ToolboxRest {
  /** For the gateway: the handler of a special toolbox route, if `path` (below the API base) is one. */
  intercept(verb: string, path: string): ((req: IncomingMessage, res: ServerResponse) => Promise<void>) | undefined;
  /** For the HTTP/1.1 server's upgrade event: true when the request was taken. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean;
  close(): void;
}

export function toolboxRest(opts: { impls: ImplIndex; locator: AgentLocator; clients: AgentClients; basePath: string; prefixes: string[] }): ToolboxRest {
  const routes = new SpecialRoutes(opts.prefixes, ROUTES);
  const sockets = new ToolboxWebSockets(opts);
  return {
    intercept(verb, path) {
      const match = routes.match(verb, path);
      if (!match) return undefined;
      return async (req, res) => {
        const url = req.url ?? "/";
        const q = url.indexOf("?");
        const sandboxId = match.params.sandbox_id;
        const caller = guardedCaller(opts.impls, req, sandboxId, requestSignal(res));
        await match.handle({ req, res, sandboxId, params: match.params, query: new URLSearchParams(q < 0 ? "" : url.slice(q + 1)), caller });
      };
    },
    upgrade: (req, socket, head) => sockets.handleUpgrade(req, socket, head),
    close: () => sockets.close(),
  };
}
