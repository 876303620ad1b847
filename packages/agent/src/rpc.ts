import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { requireSecret, secretCheck } from "./auth.ts";
import type { AgentContext } from "./context.ts";
import { serviceLoaders } from "./services.ts";
import type { Areas } from "./services.ts";
import { resolvePath } from "./util/paths.ts";

/** Most bytes of one request message (upload chunks, replace bodies). */
const READ_MAX_BYTES = 32 * 1024 * 1024;

/** Calls that grpc-wire/upload.ts and download.ts may answer (plain gRPC only). */
const TRANSFERS = new Set([
  "/sandbar.agent.v1.FileService/UploadFile",
  "/sandbar.agent.v1.FileService/UploadFiles",
  "/sandbar.agent.v1.FileService/DownloadFile",
]);

export interface RpcHandler {
  (req: Http2ServerRequest, res: Http2ServerResponse): void;
  /** Loads these services now rather than on their first call. */
  preload(services: string[]): Promise<void>;
}

/**
 * The agent's Connect/gRPC handler: one Connect adapter per service, made on
 * the service's first call, every call checked for the secret.
 */
export function createRpcHandler(ctx: AgentContext, areas: Areas, secret: string): RpcHandler {
  const interceptors = [requireSecret(secret)];
  const handlers = new Map<string, Promise<ReturnType<typeof connectNodeAdapter>>>();
  const handlerFor = (service: string) => {
    let h = handlers.get(service);
    if (!h) {
      h = serviceLoaders[service](ctx, areas).then((routes) =>
        connectNodeAdapter({
          routes,
          interceptors,
          readMaxBytes: READ_MAX_BYTES,
          // Local sockets: compression costs CPU and buys nothing.
          acceptCompression: [],
          shutdownSignal: ctx.shutdown,
        }),
      );
      h.catch(() => handlers.delete(service));
      handlers.set(service, h);
    }
    return h;
  };
  const authorized = secretCheck(secret);
  let transfers: Promise<typeof import("./grpc-wire/index.ts")> | undefined;
  const direct = { authorized, resolve: (p: string) => resolvePath(ctx.workDir, p), readMaxBytes: READ_MAX_BYTES };
  const handle = (req: Http2ServerRequest, res: Http2ServerResponse) => {
    // Large file transfers over gRPC skip Connect's per-message pipeline (grpc-wire/).
    if (TRANSFERS.has(req.url)) {
      transfers ??= import("./grpc-wire/index.ts");
      transfers
        .then((wire) => {
          if (wire.isDirectUpload(req)) return wire.serveDirectUpload(req, res, direct);
          if (wire.isDirectDownload(req)) return wire.serveDirectDownload(req, res, direct);
          return handlerFor("sandbar.agent.v1.FileService").then((h) => h(req, res));
        })
        .catch((err: unknown) => {
          ctx.log("cannot serve a transfer", err);
          if (!res.headersSent) res.writeHead(500).end();
        });
      return;
    }
    // Paths are /<package>.<Service>/<Method>.
    const service = req.url.slice(1, req.url.indexOf("/", 1));
    if (!Object.hasOwn(serviceLoaders, service)) {
      res.writeHead(404).end();
      return;
    }
    handlerFor(service).then(
      (h) => h(req, res),
      (err: unknown) => {
        ctx.log(`cannot load ${service}`, err);
        if (!res.headersSent) res.writeHead(500).end();
      },
    );
  };
  return Object.assign(handle, {
    preload: async (services: string[]) => {
      await Promise.all(services.map((s) => handlerFor(s)));
    },
  });
}
