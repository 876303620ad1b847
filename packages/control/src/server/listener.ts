import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { Duplex } from "node:stream";
import { closeWith, ConnectionGuard, type ConnectionLimits } from "./connection-limits.ts";
import { proxyAdmission, type ProxyProtocolOptions } from "./proxy-accept.ts";

type Handler = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => void;
/** Takes an HTTP/1.1 upgrade request (WebSocket); false when it is not for this handler. */
export type UpgradeHandler = (req: http.IncomingMessage, socket: Duplex, head: Buffer) => boolean;

export interface Listener {
  port: number;
  /** Stops accepting, lets requests in flight finish (up to `graceMs`), then drops the rest. */
  close(graceMs?: number): Promise<void>;
}

/**
 * One TCP port for HTTP/1.1 and cleartext HTTP/2 (h2c with prior knowledge, as gRPC uses):
 * the first bytes of each connection say which; the connection is handed to that server.
 * With `proxyProtocol`, connections from the listed load balancers first give their PROXY header.
 * `limits`: connection caps and timeouts (connection-limits.ts).
 */
export function listenOnePort(handler: Handler, port: number, host: string, onUpgrade: UpgradeHandler | undefined, proxyProtocol: ProxyProtocolOptions | undefined, limits: ConnectionLimits): Promise<Listener> {
  const admit = proxyAdmission(proxyProtocol);
  const guard = new ConnectionGuard(limits);
  // HTTP/1.1 sockets with a request in flight; idle ones are dropped at once on close.
  const busy = new Map<net.Socket, number>();
  let closing = false;
  const h1 = http.createServer(guard.http1Options, (req, res) => {
    const socket = req.socket;
    busy.set(socket, (busy.get(socket) ?? 0) + 1);
    res.once("close", () => {
      const n = (busy.get(socket) ?? 1) - 1;
      if (n > 0) busy.set(socket, n);
      else busy.delete(socket);
      if (closing && n <= 0) socket.destroy();
    });
    handler(req, res);
  });
  // Upgrades (WebSockets) go to onUpgrade; any other is refused rather than left hanging.
  h1.on("upgrade", (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    if (!onUpgrade?.(req, socket, head)) socket.end("HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  });
  // Requests Node refuses before any handler sees them (oversized headers, malformed HTTP) get
  // the API's JSON error body instead of Node's bare status line.
  h1.on("clientError", (err: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable) return socket.destroy();
    const [status, error, message] =
      err.code === "HPE_HEADER_OVERFLOW" ? [431, "Request Header Fields Too Large", "The request's URL and headers exceed 16 KB"]
      : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? [408, "Request Timeout", "The request was not received in time (SANDBAR_HEADERS_TIMEOUT_MS, SANDBAR_BODY_TIMEOUT_MS)"]
      : [400, "Bad Request", "Malformed HTTP request"];
    const body = JSON.stringify({ statusCode: status, message, error, timestamp: new Date().toISOString() });
    closeWith(socket, `HTTP/1.1 ${status} ${error}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  });
  const h2 = http2.createServer({}, handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  const sockets = new Set<net.Socket>();
  const h1Sockets = new WeakSet<net.Socket>();
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
  });
  // net.createServer does not set TCP_NODELAY as http.createServer would; multi-frame h2 replies need it.
  const server = net.createServer({ noDelay: true }, (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => socket.destroy());
    guard.accepted(socket);
    void admit(socket).then((admitted) => {
      if (!admitted || closing) return socket.destroy();
      if (!guard.admit(socket)) return;
      socket.once("data", (first) => {
        socket.pause();
        socket.unshift(first);
        if (first.subarray(0, 3).toString("latin1") === "PRI") h2.emit("connection", socket);
        else {
          h1Sockets.add(socket);
          h1.emit("connection", socket);
        }
        process.nextTick(() => socket.resume());
      });
      // A PROXY header's reader leaves the socket paused (what followed the header put back).
      socket.resume();
    });
  });
  guard.attach(server, h1, h2);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () =>
      resolve({
        port: (server.address() as net.AddressInfo).port,
        close: async (graceMs = 5000) => {
          closing = true;
          guard.close();
          const closed = new Promise<void>((r) => server.close(() => r()));
          for (const s of sockets) if (h1Sockets.has(s) && !busy.has(s)) s.destroy();
          for (const s of sessions) s.close();
          const timer = setTimeout(() => sockets.forEach((s) => s.destroy()), graceMs);
          await closed;
          clearTimeout(timer);
        },
      }),
    );
  });
}
