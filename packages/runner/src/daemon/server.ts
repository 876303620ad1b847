import { createHash, timingSafeEqual } from "node:crypto";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { RunnerService, RunnerSnapshotService } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { SandboxRuntime } from "../runtime.ts";
import { AGENT_API_PATH, AGENT_TUNNEL_PATH, ERROR_HEADER, serveAgentStream } from "./agent-streams.ts";
import { runnerServiceImpl } from "./service.ts";
import { runnerSnapshotServiceImpl } from "./snapshot-service.ts";

// A runner's port: RunnerService over gRPC (and Connect) plus the agent streams, HTTP/2 only
// (cleartext h2c, or TLS when a certificate is given). Every request carries the runner's
// credential as a bearer; it is compared by its SHA-256 in constant time and never logged.

export interface RunnerServerOptions {
  runtime: SandboxRuntime;
  /** SHA-256 of the credential control presents (register.ts). */
  credentialSha256: Buffer;
  dataDir: string;
  version: string;
  host: string;
  port: number;
  /** PEM certificate chain and key: TLS instead of h2c. */
  tls?: { cert: string; key: string };
  capacity?: { cpu?: number; memoryGiB?: number; diskGiB?: number; gpu?: number; gpuType?: string };
  /** Whether it mounts volumes from a shared volume root. */
  sharedVolumes?: boolean;
  log?: (line: string) => void;
}

export interface RunnerServer {
  port: number;
  url: string;
  close(): Promise<void>;
}

/** HTTP/2 flow-control windows: large enough that one agent stream moves bulk data at memory speed. */
const STREAM_WINDOW = 4 * 1024 * 1024;
const SESSION_WINDOW = 32 * 1024 * 1024;

function bearerCheck(want: Buffer): (authorization: string | undefined) => boolean {
  if (want.length !== 32) throw new Error("the runner credential's hash must be a SHA-256");
  return (authorization) => {
    const m = /^Bearer (.+)$/.exec(authorization ?? "");
    return !!m && timingSafeEqual(createHash("sha256").update(m[1]!).digest(), want);
  };
}

export async function startRunnerServer(o: RunnerServerOptions): Promise<RunnerServer> {
  const authorized = bearerCheck(o.credentialSha256);
  const rpc = connectNodeAdapter({
    routes: (router) => {
      router.service(RunnerService, runnerServiceImpl({ runtime: o.runtime, dataDir: o.dataDir, version: o.version, capacity: o.capacity, sharedVolumes: o.sharedVolumes }));
      router.service(RunnerSnapshotService, runnerSnapshotServiceImpl(o.runtime));
    },
  });
  const handler = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    if (!authorized(req.headers.authorization)) {
      // gRPC clients read grpc-status; others the status and the reason header.
      res.writeHead(401, { "content-type": "application/grpc", "grpc-status": "16", "grpc-message": "Invalid runner credential", [ERROR_HEADER]: "Invalid runner credential" });
      return void res.end();
    }
    if (req.url === AGENT_API_PATH || req.url === AGENT_TUNNEL_PATH) {
      return void serveAgentStream(o.runtime, req, res).catch((err: unknown) => {
        o.log?.(`agent stream: ${err instanceof Error ? err.message : String(err)}`);
        res.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
      });
    }
    rpc(req, res);
  };
  const settings = { initialWindowSize: STREAM_WINDOW };
  const server = o.tls ? http2.createSecureServer({ cert: o.tls.cert, key: o.tls.key, settings }, handler) : http2.createServer({ settings }, handler);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
    try {
      s.setLocalWindowSize(SESSION_WINDOW);
    } catch {
      s.once("connect", () => s.setLocalWindowSize(SESSION_WINDOW));
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const host = o.host.includes(":") ? `[${o.host}]` : o.host;
  return {
    port,
    url: `${o.tls ? "https" : "http"}://${host === "0.0.0.0" ? "127.0.0.1" : host}:${port}`,
    async close() {
      const closed = new Promise<void>((r) => server.close(() => r()));
      for (const s of sessions) s.close();
      setTimeout(() => sessions.forEach((s) => s.destroy()), 2000).unref();
      await closed;
    },
  };
}
