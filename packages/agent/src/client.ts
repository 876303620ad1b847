import type { ClientSessionOptions } from "node:http2";
import { connect as netConnect } from "node:net";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

/** HTTP/2 stream window a client of the agent should offer (default 64 KiB). */
const STREAM_WINDOW = 1024 * 1024;
/** Frames for already-closed streams tolerated on one connection. */
const INVALID_FRAMES = 1_000_000;
/** Largest frame the agent may send: fewer, larger frames for downloads and log streams. */
const MAX_FRAME = 256 * 1024;

/**
 * A Connect transport (gRPC protocol over HTTP/2) to an agent's unix socket,
 * sending the agent's secret on every call and tuned for large streams.
 * (Not the connection window: widening it with setLocalWindowSize makes the
 * connection stall after a download is cancelled mid-stream, on Node 24.)
 */
export function agentTransport(socketPath: string, secret: string): Transport {
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${secret}`);
    return next(req);
  };
  return createGrpcTransport({
    baseUrl: "http://localhost",
    interceptors: [auth],
    nodeOptions: {
      createConnection: () => netConnect(socketPath),
      settings: { initialWindowSize: STREAM_WINDOW, maxFrameSize: MAX_FRAME },
      // Frames still in flight for a stream this side cancelled count as invalid, and
      // Node's default (1000) ends the connection after a few cancelled downloads.
      // (Node applies this option to client sessions too; its types list it for servers.)
      ...({ maxSessionInvalidFrames: INVALID_FRAMES } as Partial<ClientSessionOptions>),
    },
  });
}
