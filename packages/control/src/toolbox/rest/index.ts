import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { DescMethod } from "@bufbuild/protobuf";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import type { ImplIndex } from "../../gateway/handler.ts";
import type { AgentClients } from "../agent-clients.ts";
import type { AgentLocator } from "../agent-locator.ts";
import { guardedCaller } from "./call.ts";
import { bulkDownload, singleDownload } from "./download.ts";
import { execute } from "./execute.ts";
import { deleteFile } from "./files.ts";
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
export const TOOLBOX_REST_ROUTES: Array<SpecialRoute<Handled>> = [
  { verb: "POST", path: "/files/bulk-upload", handle: { method: FileService.method.uploadFiles, serve: bulkUpload } },
  { verb: "POST", path: "/files/upload", handle: { method: FileService.method.uploadFiles, serve: singleUpload } },
  { verb: "POST", path: "/files/bulk-download", handle: { method: FileService.method.downloadFiles, serve: bulkDownload } },
  { verb: "GET", path: "/files/download", handle: { method: FileService.method.downloadFiles, serve: singleDownload } },
  { verb: "DELETE", path: "/files", handle: { method: FileService.method.deleteFile, serve: deleteFile } },
  { verb: "POST", path: "/process/execute", handle: { method: ProcessService.method.execute, serve: execute } },
  { verb: "POST", path: "/process/session", handle: { method: ProcessService.method.createSession, serve: createSession } },
  { verb: "POST", path: "/process/session/{session_id}/exec", handle: { method: ProcessService.method.sessionExecute, serve: sessionExec } },
  { verb: "GET", path: "/process/session/{session_id}/command/{command_id}/logs", handle: { method: ProcessService.method.getSessionCommand, serve: commandLogs } },
  { verb: "POST", path: "/process/pty", handle: { method: PtyService.method.createPty, serve: createPty } },
];

/** A special route's handler, and the method whose rule the caller is checked against before any body is read. */
interface Handled {
  method: DescMethod;
  serve: RestHandler;
}

export interface ToolboxRest {
  /** For the gateway: the handler of a special toolbox route, if `path` (below the API base) is one. */
  intercept(verb: string, path: string): ((req: IncomingMessage, res: ServerResponse) => Promise<void>) | undefined;
  /** For the HTTP/1.1 server's upgrade event: true when the request was taken. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean;
  close(): void;
}

export function toolboxRest(opts: { impls: ImplIndex; locator: AgentLocator; clients: AgentClients; basePath: string; prefixes: string[] }): ToolboxRest {
  const routes = new SpecialRoutes(opts.prefixes, TOOLBOX_REST_ROUTES);
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
        await caller.authorize(match.handle.method);
        await match.handle.serve({ req, res, sandboxId, params: match.params, query: new URLSearchParams(q < 0 ? "" : url.slice(q + 1)), caller });
      };
    },
    upgrade: (req, socket, head) => sockets.handleUpgrade(req, socket, head),
    close: () => sockets.close(),
  };
}
