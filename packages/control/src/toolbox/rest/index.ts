import type { DescMethod } from "@bufbuild/protobuf";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import type { CallChain } from "../../call/chain.ts";
import type { HandwrittenRoute, UpgradeRoute } from "../../gateway/rest-route.ts";
import type { AgentLocator } from "../agent-locator.ts";
import { chainCaller } from "./call.ts";
import { bulkDownload, singleDownload } from "./download.ts";
import { execute } from "./execute.ts";
import { deleteFile } from "./files.ts";
import { createPty } from "./pty.ts";
import type { RestHandler, ToolboxRoute } from "./routes.ts";
import { commandLogs, createSession, sessionExec } from "./sessions.ts";
import { admitSignedFileRequest, isSignedFileRequest, type SignedUrlKeys } from "./signed-file-url.ts";
import { bulkUpload, singleUpload, uploadV2 } from "./upload.ts";
import { ToolboxWebSockets } from "./websocket.ts";

/**
 * The toolbox routes whose wire format the generic JSON gateway cannot produce: multipart
 * uploads and downloads, raw byte streams, statuses and shapes that depend on the request
 * (SDK version, async exec), the legacy command wrapper. Paths are relative to a toolbox prefix.
 */
export const TOOLBOX_REST_ROUTES: Array<ToolboxRoute<Handled>> = [
  { verb: "POST", path: "/files/bulk-upload", handle: { method: FileService.method.uploadFiles, serve: bulkUpload } },
  { verb: "POST", path: "/files/upload", handle: { method: FileService.method.uploadFiles, serve: singleUpload } },
  { verb: "POST", path: "/files/upload-v2", handle: { method: FileService.method.uploadFile, serve: uploadV2, signed: true } },
  { verb: "POST", path: "/files/bulk-download", handle: { method: FileService.method.downloadFiles, serve: bulkDownload } },
  { verb: "GET", path: "/files/download", handle: { method: FileService.method.downloadFiles, serve: singleDownload, signed: true } },
  { verb: "DELETE", path: "/files", handle: { method: FileService.method.deleteFile, serve: deleteFile } },
  { verb: "POST", path: "/process/execute", handle: { method: ProcessService.method.execute, serve: execute } },
  { verb: "POST", path: "/process/session", handle: { method: ProcessService.method.createSession, serve: createSession } },
  { verb: "POST", path: "/process/session/{session_id}/exec", handle: { method: ProcessService.method.sessionExecute, serve: sessionExec } },
  { verb: "GET", path: "/process/session/{session_id}/command/{command_id}/logs", handle: { method: ProcessService.method.getSessionCommand, serve: commandLogs } },
  { verb: "POST", path: "/process/pty", handle: { method: PtyService.method.createPty, serve: createPty } },
];

/** A hand-written route's handler, and the method whose rule the caller is checked against before any body is read. */
interface Handled {
  method: DescMethod;
  serve: RestHandler;
  /** Also opened by a signed URL (the 0.218 client's downloadUrl/uploadUrl) instead of an API key. */
  signed?: boolean;
}

export interface ToolboxRest {
  /** Entries of the gateway's route table, under every toolbox prefix. */
  handwritten: HandwrittenRoute[];
  upgrades: UpgradeRoute[];
  /** Closes the open WebSockets (server going away). */
  close(): void;
}

export function toolboxRest(opts: { chain: CallChain; locator: AgentLocator; prefixes: string[]; signedUrls?: SignedUrlKeys }): ToolboxRest {
  const sockets = new ToolboxWebSockets(opts);
  const { signedUrls } = opts;
  const handwritten = opts.prefixes.flatMap((prefix) =>
    TOOLBOX_REST_ROUTES.map(({ verb, path, handle }): HandwrittenRoute => ({
      verb,
      template: prefix + path,
      method: handle.method,
      admitsOwn:
        handle.signed && signedUrls
          ? async ({ req, query, call }) => {
              if (!isSignedFileRequest(req.headers, query)) return false;
              await admitSignedFileRequest(opts.chain, call, handle.method, verb, query, signedUrls);
              return true;
            }
          : undefined,
      serve: ({ req, res, params, query, signal, call }) => handle.serve({ req, res, sandboxId: params.sandbox_id!, params, query, caller: chainCaller(opts.chain, call, signal) }),
    })),
  );
  return { handwritten, upgrades: sockets.routes(opts.prefixes), close: () => sockets.close() };
}
