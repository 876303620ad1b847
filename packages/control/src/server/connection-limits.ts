import type http from "node:http";
import http2 from "node:http2";
import { isIPv4, type Server, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { addressList, peerAddress } from "./client-address.ts";
import type { OpenFilesLimit } from "./open-files.ts";

/** Connection caps and timeouts of the one port (docs/configuration.md, "The port and connections": SANDBAR_MAX_CONNECTIONS and the entries after it). */
export interface ConnectionSettings {
  /** Open connections at most, all clients together (SANDBAR_MAX_CONNECTIONS); unset: from the open-files limit at start. */
  maxConnections?: number;
  /** Open connections of one client address, an IPv6 client's /64 as one (SANDBAR_MAX_CONNECTIONS_PER_ADDRESS); 0: no cap. */
  maxConnectionsPerAddress: number;
  /** A request head (HTTP/2: the preface and the client's SETTINGS) must be whole this long after the connection or the request began. */
  headersTimeoutMs: number;
  /** A connection with no request in flight (HTTP/2: no stream open) is closed after this long. */
  idleTimeoutMs: number;
  /** A request body that brings less than BODY_MIN_PROGRESS bytes in this long ends its request (HTTP/2: a stream that receives nothing). */
  bodyTimeoutMs: number;
}

/** A body trickled slower than this per SANDBAR_BODY_TIMEOUT_MS is stalled: a byte at a time must not keep a request alive. */
const BODY_MIN_PROGRESS = 1024;

export function loadConnectionSettings(env: NodeJS.ProcessEnv): ConnectionSettings {
  return {
    maxConnections: env.SANDBAR_MAX_CONNECTIONS ? whole(env, "SANDBAR_MAX_CONNECTIONS", 1, 0) : undefined,
    maxConnectionsPerAddress: whole(env, "SANDBAR_MAX_CONNECTIONS_PER_ADDRESS", 0, 256),
    headersTimeoutMs: whole(env, "SANDBAR_HEADERS_TIMEOUT_MS", 1, 20_000),
    idleTimeoutMs: whole(env, "SANDBAR_IDLE_TIMEOUT_MS", 1, 65_000),
    bodyTimeoutMs: whole(env, "SANDBAR_BODY_TIMEOUT_MS", 1, 60_000),
  };
}

function whole(env: NodeJS.ProcessEnv, name: string, min: number, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be a whole number >= ${min}, got "${raw}"`);
  return n;
}

/**
 * Half the open-files limit: the other half stays for what the process opens itself (PostgreSQL
 * connections, sandboxes' pipes, sockets and logs, webhook deliveries, files). At most 65,536:
 * past that memory, not descriptors, runs out first.
 */
export function defaultMaxConnections(openFiles: number | undefined): number {
  return Math.max(64, Math.min(65_536, Math.floor((openFiles ?? 8192) / 2)));
}

/** What the listener enforces: the settings, resolved. */
export interface ConnectionLimits extends ConnectionSettings {
  maxConnections: number;
  /** Peers not capped per address (each carries many clients: a local or trusted proxy, a load balancer speaking for itself). */
  exempt: (address: string) => boolean;
  log?: (line: string) => void;
}

/** What connectionLimits reads of the server's settings (named here: settings.ts imports this module). */
interface ConnectionLimitSettings {
  connections: ConnectionSettings;
  trustedProxies: string[];
  proxyProtocolFrom: string[];
}

/** The limits for `settings`: loopback, trusted proxies and PROXY protocol balancers are not capped per address. */
export function connectionLimits(settings: ConnectionLimitSettings, files: OpenFilesLimit | undefined, log: (line: string) => void): ConnectionLimits {
  const list = addressList(["127.0.0.1", "::1", ...settings.trustedProxies, ...settings.proxyProtocolFrom]);
  return {
    ...settings.connections,
    maxConnections: settings.connections.maxConnections ?? defaultMaxConnections(files?.soft),
    exempt: (address) => list.check(address, isIPv4(address) ? "ipv4" : "ipv6"),
    log,
  };
}

/** The key a client's connections are counted under: an IPv4 address, or an IPv6 address's /64 (one host's usual share). */
export function addressKey(address: string): string {
  if (!address.includes(":")) return address;
  const bare = address.split("%")[0]!;
  const [left = "", right] = bare.split("::");
  const head = left ? left.split(":") : [];
  const tail = right ? right.split(":") : [];
  const groups = right === undefined ? head : [...head, ...Array<string>(Math.max(0, 8 - head.length - tail.length)).fill("0"), ...tail];
  return `${groups.slice(0, 4).map((g) => parseInt(g, 16).toString(16)).join(":")}::/64`;
}

const HEAD_DEADLINE = Symbol("sandbar.headDeadline");
const COUNTED_AS = Symbol("sandbar.countedAs");
const HTTP1 = Symbol("sandbar.http1");
type Guarded = Socket & { [HEAD_DEADLINE]?: NodeJS.Timeout; [COUNTED_AS]?: string; [HTTP1]?: http.Server };

interface BodyWatch {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  socket: Socket;
  /** bytesRead when the body last made progress, and when. */
  mark: number;
  since: number;
}

/** How often deadlines counted by a sweep are checked: a quarter of the timeout, between 50 ms and 5 s. */
const sweepEvery = (ms: number) => Math.max(50, Math.min(5_000, Math.floor(ms / 4)));

/**
 * The caps and timeouts of one listener (listener.ts). The listener calls `accepted` and `admit`
 * for each connection; the rest follows the HTTP/1.1 and HTTP/2 servers' events once `attach`ed.
 * Connections over a cap are closed before any byte of theirs is read; nothing here applies to
 * a WebSocket once upgraded, nor to a response, however long, once its request is whole.
 */
export class ConnectionGuard {
  private readonly perAddress = new Map<string, number>();
  private readonly bodies = new Set<BodyWatch>();
  private sweeper?: NodeJS.Timeout;
  private h1?: http.Server;
  private readonly logRefused: (line: string) => void;
  private readonly logDropped: (line: string) => void;
  private readonly limits: ConnectionLimits;

  constructor(limits: ConnectionLimits) {
    this.limits = limits;
    const log = limits.log ?? (() => {});
    this.logRefused = throttled(log);
    this.logDropped = throttled(log);
  }

  /**
   * Node's own head deadline and keep-alive timeout for the HTTP/1.1 server. Its requestTimeout
   * would bound a whole upload, however fast: bodies are watched for progress instead.
   */
  get http1Options(): http.ServerOptions {
    const { headersTimeoutMs, idleTimeoutMs } = this.limits;
    return { headersTimeout: headersTimeoutMs, requestTimeout: 0, keepAliveTimeout: idleTimeoutMs, connectionsCheckingInterval: sweepEvery(headersTimeoutMs) };
  }

  attach(server: Server, h1: http.Server, h2: http2.Http2Server): void {
    const { maxConnections } = this.limits;
    // Node closes connections over it as they are accepted, before a JS socket exists.
    server.maxConnections = maxConnections;
    server.on("drop", (d?: { remoteAddress?: string }) => this.logDropped(`refusing new connections: ${maxConnections} open (SANDBAR_MAX_CONNECTIONS); the latest from ${d?.remoteAddress ?? "?"}`));
    // Node checks request heads against headersTimeout only for a server that listened (the
    // check starts on "listening"); this one is handed its sockets by the listener.
    h1.emit("listening");
    this.h1 = h1;
    h1.on("connection", (socket: Guarded) => (socket[HTTP1] = h1));
    h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
      this.headDone(req.socket);
      const h = req.headers;
      if (h["transfer-encoding"] !== undefined || (h["content-length"] !== undefined && h["content-length"] !== "0")) this.watchBody(req, res);
    });
    h1.on("upgrade", (req: http.IncomingMessage) => this.headDone(req.socket));
    h2.on("session", (session: http2.ServerHttp2Session) => this.watchSession(session));
    this.sweeper = setInterval(() => this.sweepBodies(), sweepEvery(this.limits.bodyTimeoutMs)).unref();
  }

  /** At accept: the first request head (HTTP/2: the preface and SETTINGS) is due within headersTimeout, PROXY header included. */
  accepted(socket: Socket): void {
    const s = socket as Guarded;
    s[HEAD_DEADLINE] = setTimeout(() => this.headTimedOut(s), this.limits.headersTimeoutMs).unref();
    socket.once("close", () => {
      clearTimeout(s[HEAD_DEADLINE]);
      const key = s[COUNTED_AS];
      if (key === undefined) return;
      const n = (this.perAddress.get(key) ?? 1) - 1;
      if (n > 0) this.perAddress.set(key, n);
      else this.perAddress.delete(key);
    });
  }

  /**
   * Counts the connection against its client address (the one a PROXY header stated, so after
   * admission); over the cap it is reset at once and false is returned.
   */
  admit(socket: Socket): boolean {
    const cap = this.limits.maxConnectionsPerAddress;
    if (cap === 0) return true;
    const address = peerAddress(socket);
    if (!address || this.limits.exempt(address)) return true;
    const key = addressKey(address);
    const n = this.perAddress.get(key) ?? 0;
    if (n >= cap) {
      // A reset rather than a close: no TIME_WAIT left here for each refused connection.
      socket.resetAndDestroy();
      this.logRefused(`refusing connections from ${key}: ${cap} open (SANDBAR_MAX_CONNECTIONS_PER_ADDRESS)`);
      return false;
    }
    this.perAddress.set(key, n + 1);
    (socket as Guarded)[COUNTED_AS] = key;
    return true;
  }

  close(): void {
    clearInterval(this.sweeper);
    // Stops Node's head checks that attach started (and drops its idle connections, as the listener does).
    this.h1?.close();
  }

  private headDone(socket: Socket): void {
    const s = socket as Guarded;
    clearTimeout(s[HEAD_DEADLINE]);
    s[HEAD_DEADLINE] = undefined;
  }

  private headTimedOut(socket: Guarded): void {
    if (socket.destroyed) return;
    // Over HTTP/1.1 answered 408 as Node's own head deadline is; before any protocol, or over HTTP/2, just closed.
    if (socket[HTTP1]) socket[HTTP1].emit("clientError", requestTimeout("request head timeout"), socket);
    else socket.destroy();
  }

  private watchBody(req: http.IncomingMessage, res: http.ServerResponse): void {
    const w: BodyWatch = { req, res, socket: req.socket, mark: req.socket.bytesRead, since: performance.now() };
    this.bodies.add(w);
    // Once the body is read (or the request aborted); a body left unread after the answer is
    // drained by Node and watched until then.
    req.once("close", () => this.bodies.delete(w));
  }

  private sweepBodies(): void {
    const now = performance.now();
    for (const w of this.bodies) {
      const { req, res, socket } = w;
      if (req.complete || socket.destroyed) {
        this.bodies.delete(w);
        continue;
      }
      // A paused socket is the server not reading (back-pressure), not the client stalling.
      if (socket.bytesRead - w.mark >= BODY_MIN_PROGRESS || socket.isPaused()) {
        w.mark = socket.bytesRead;
        w.since = now;
        continue;
      }
      if (now - w.since < this.limits.bodyTimeoutMs) continue;
      this.bodies.delete(w);
      if (!res.headersSent && socket.writable && this.h1) this.h1.emit("clientError", requestTimeout("request body stalled"), socket);
      else socket.destroy();
    }
  }

  private watchSession(session: http2.ServerHttp2Session): void {
    const { idleTimeoutMs } = this.limits;
    // The preface and the client's SETTINGS are its "head".
    session.once("remoteSettings", () => this.headDone(session.socket as Socket));
    // Idle means no stream open, not no bytes: PINGs do not keep a connection, a quiet stream does.
    let open = 0;
    const idle = setTimeout(() => {
      if (open === 0 && !session.closed && !session.destroyed) session.close();
    }, idleTimeoutMs).unref();
    session.once("close", () => clearTimeout(idle));
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      open++;
      stream.once("close", () => {
        if (--open === 0) idle.refresh();
      });
      if (!stream.endAfterHeaders) this.watchStream(stream);
    });
  }

  /** A stream whose request body receives nothing for bodyTimeout is reset (HTTP/2 counts no bytes per stream). */
  private watchStream(stream: http2.ServerHttp2Stream): void {
    const ms = this.limits.bodyTimeoutMs;
    stream.on("timeout", () => {
      if (stream.destroyed || stream.state.remoteClose) return void stream.setTimeout(0);
      // The handler not reading is not the client's stall: look again later.
      if (stream.isPaused() || stream.readableLength >= stream.readableHighWaterMark) return void stream.setTimeout(ms);
      stream.close(http2.constants.NGHTTP2_CANCEL);
    });
    stream.setTimeout(ms);
  }
}

/** The error code of Node's own head deadline, so that one clientError handler answers both. */
function requestTimeout(message: string): NodeJS.ErrnoException {
  return Object.assign(new Error(message), { code: "ERR_HTTP_REQUEST_TIMEOUT" });
}

/**
 * Writes a last answer and closes the socket once it is flushed. A client that never reads it
 * (or never closes its side) is dropped anyway a second later: a half-closed socket still holds
 * a descriptor.
 */
export function closeWith(socket: Duplex, answer: string): void {
  const timer = setTimeout(() => socket.destroy(), 1000).unref();
  socket.once("close", () => clearTimeout(timer));
  socket.end(answer, () => socket.destroy());
}

/** One line now, then at most one a minute, with the number held back. */
function throttled(log: (line: string) => void, everyMs = 60_000): (line: string) => void {
  let last = -Infinity;
  let held = 0;
  return (line) => {
    const now = performance.now();
    if (now - last < everyMs) return void held++;
    log(held ? `${line} (${held} more such since the last line)` : line);
    last = now;
    held = 0;
  };
}
