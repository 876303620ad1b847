import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { Duplex } from "node:stream";
import { Code } from "@sandbar/protocol";
import { errorBody, rawErrorAnswer } from "../gateway/error-answer.ts";
import { httpError } from "../gateway/http-io.ts";
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
 * Upgrades go to the upgrade handler (WebSockets, and whatever the preview proxy forwards), but
 * not `Upgrade: h2c` (curl --http2): Node's HTTP/2 server cannot take an HTTP/1.1 request as its
 * first stream, so that request is served over HTTP/1.1, the upgrade ignored (RFC 9110 7.8 lets a
 * server). Node before 22.21 / 24.9 does not ask this and still hands such requests to `upgrade`.
 */
function wantsUpgrade(req: http.IncomingMessage): boolean {
  const offered = String(req.headers.upgrade ?? "").split(",").map((p) => p.trim().toLowerCase()).filter(Boolean);
  return offered.some((p) => p !== "h2c");
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
  const h1 = http.createServer({ ...guard.http1Options, shouldUpgradeCallback: wantsUpgrade }, (req, res) => {
    const ambiguous = hostProblem(req.rawHeaders);
    if (ambiguous) return badRequest(res, ambiguous);
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
    const ambiguous = hostProblem(req.rawHeaders);
    if (ambiguous) return closeWith(socket, rawErrorAnswer(undefined, httpError(400, ambiguous)));
    if (!onUpgrade?.(req, socket, head)) socket.end("HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  });
  // Requests Node refuses before any handler sees them (oversized headers, malformed HTTP) get
  // the API's JSON error body instead of Node's bare status line.
  h1.on("clientError", (err: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable) return socket.destroy();
    const refusal =
      err.code === "HPE_HEADER_OVERFLOW" ? httpError(431, "The request's URL and headers exceed 16 KB", Code.ResourceExhausted)
      : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? httpError(408, "The request was not received in time (SANDBAR_HEADERS_TIMEOUT_MS, SANDBAR_BODY_TIMEOUT_MS)", Code.DeadlineExceeded)
      : httpError(400, "Malformed HTTP request");
    closeWith(socket, rawErrorAnswer(undefined, refusal));
  });
  const h2 = http2.createServer({}, (req, res) => {
    const ambiguous = hostProblem(req.rawHeaders);
    if (ambiguous) return badRequest(res, ambiguous);
    handler(req, res);
  });
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

/**
 * Why the request's host is ambiguous, or undefined: more than one Host header, or (HTTP/2) a
 * Host that differs from :authority. Node keeps the first Host and drops the rest, and the
 * preview proxy reads Host before :authority where gRPC reads :authority; a proxy in front may
 * have routed by another one. Refused as Node's parser refuses two Content-Lengths.
 */
function hostProblem(rawHeaders: string[]): string | undefined {
  let host: string | undefined;
  let authority: string | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    if (name.length === 4 && name.toLowerCase() === "host") {
      if (host !== undefined) return "The request has more than one Host header";
      host = rawHeaders[i + 1]!;
    } else if (name === ":authority") authority = rawHeaders[i + 1]!;
  }
  if (host !== undefined && authority !== undefined && host.toLowerCase() !== authority.toLowerCase()) return "The request's Host header differs from its :authority";
  return undefined;
}

/** 400 before any handler sees the request; an HTTP/1.1 connection closes after it (what follows on it is not trusted). */
function badRequest(res: http.ServerResponse | http2.Http2ServerResponse, message: string): void {
  const body = JSON.stringify(errorBody(undefined, httpError(400, message)));
  const headers: http.OutgoingHttpHeaders = { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(body) };
  if (res instanceof http.ServerResponse) res.writeHead(400, { ...headers, connection: "close" }).end(body);
  else res.writeHead(400, headers).end(body);
}
