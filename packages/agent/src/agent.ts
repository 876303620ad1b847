import { mkdirSync, mkdtempSync, statSync } from "node:fs";
import { rm, unlink } from "node:fs/promises";
import { connect as netConnect, createServer as createNetServer } from "node:net";
import type { Server } from "node:net";
import { homedir, tmpdir } from "node:os";
import * as path from "node:path";
import type { Http2Server, Http2ServerRequest, Http2ServerResponse, ServerHttp2Session } from "node:http2";
import type { AgentContext } from "./context.ts";
import type { RpcHandler } from "./rpc.ts";
import type { Areas } from "./services.ts";
import { tunnelSocketBeside } from "@sandbar/protocol/tunnel";
import { createTunnelServer } from "./tunnel.ts";
import { openUploadJournal } from "./files/upload-journal.ts";
import { detectShell } from "./util/shell.ts";
import { AGENT_VERSION } from "./version.ts";
import { writeErr } from "./util/stdio.ts";

export interface AgentOptions {
  /** Unix socket to serve on (created; a stale one is replaced). */
  socketPath: string;
  /** Callers must send `authorization: Bearer <secret>`. */
  secret: string;
  /** The byte tunnel's socket (see tunnel.ts); default tunnel.sock beside `socketPath`. */
  tunnelSocketPath?: string;
  /** Also serve on this TCP port (the sandbox's 2280). */
  port?: number;
  host?: string;
  /** The project/home dir: relative paths resolve against it. Default: the cwd and $HOME. */
  root?: string;
  /** Scratch space for logs; default a fresh temporary dir, removed at close. */
  stateDir?: string;
  shell?: string;
  /** The environment commands get; default the agent's own. */
  env?: NodeJS.ProcessEnv;
  /**
   * Load node:http2, Connect and the core services (info, files, processes)
   * right after listening rather than on the first call: a faster first call
   * for about 15 MB more resident memory while idle.
   */
  preload?: boolean;
  log?: (message: string, err?: unknown) => void;
  /** See AgentContext.sandboxed; default false. */
  sandboxed?: boolean;
}

export interface Agent {
  readonly socketPath: string;
  /** The TCP port, when one was asked for (0 picks a free one). */
  readonly port: number | undefined;
  readonly context: AgentContext;
  /** Stops serving and ends every session, terminal and language server. */
  close(): Promise<void>;
}

/** HTTP/2 flow-control windows: per stream and per connection. */
const WINDOW_SIZE = 1024 * 1024;
const CONNECTION_WINDOW_SIZE = 4 * 1024 * 1024;
/** Largest HTTP/2 frame a client may send: fewer, larger frames for uploads. */
const MAX_FRAME_SIZE = 256 * 1024;
/** Grace between SIGTERM and SIGKILL for what runs at shutdown. */
const SHUTDOWN_GRACE_MS = 2000;

function defaultLog(message: string, err?: unknown): void {
  const detail = err instanceof Error ? `: ${err.message}` : err !== undefined ? `: ${String(err)}` : "";
  writeErr(`sandbar-agent: ${message}${detail}\n`);
}

/** Removes a socket file left by an agent that is gone; refuses one that still answers. */
async function clearStaleSocket(socketPath: string): Promise<void> {
  if (!statSync(socketPath, { throwIfNoEntry: false })) return; // the usual case: a fresh run dir
  const live = await new Promise<boolean>((resolve) => {
    const s = netConnect(socketPath);
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
  if (live) throw new Error(`another process is serving on ${socketPath}`);
  await unlink(socketPath);
}

export async function startAgent(options: AgentOptions): Promise<Agent> {
  const log = options.log ?? defaultLog;
  const env = { ...(options.env ?? process.env) };
  delete env.SANDBAR_AGENT_SECRET;
  const ownStateDir = options.stateDir === undefined;
  // Up to the listen, the file system is used synchronously: nothing else could run meanwhile, and
  // each asynchronous call is a round trip through the thread pool (its threads start on the
  // first), which on a loaded host waits for a core each way, on the critical path of a start.
  const stateDir = options.stateDir ?? mkdtempSync(path.join(tmpdir(), "sandbar-agent-"));
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  // Before any upload of this agent: what earlier agents' interrupted uploads left goes.
  openUploadJournal(path.join(stateDir, "uploads"));
  const root = options.root !== undefined ? path.resolve(options.root) : undefined;
  const shutdown = new AbortController();
  const ctx: AgentContext = {
    workDir: root ?? process.cwd(),
    homeDir: root ?? env.HOME ?? homedir(),
    stateDir,
    env,
    envGeneration: 0,
    envChanges: new EventTarget(),
    shell: options.shell ?? detectShell(env),
    version: AGENT_VERSION,
    shutdown: shutdown.signal,
    sandboxed: options.sandboxed ?? false,
    log,
  };

  const areas: Areas = {};
  // Connect, the auth check and every service load on the first request, so
  // the agent serves as soon as its socket listens.
  let rpc: Promise<RpcHandler> | undefined;
  const loadRpc = () => (rpc ??= import("./rpc.ts").then((m) => m.createRpcHandler(ctx, areas, options.secret)));
  const handler = (req: Http2ServerRequest, res: Http2ServerResponse) => {
    loadRpc().then(
      (h) => h(req, res),
      (err: unknown) => {
        log("cannot load the RPC handler", err);
        if (!res.headersSent) res.writeHead(500).end();
      },
    );
  };

  // Listeners are plain sockets; node:http2 (and the TLS code it pulls in)
  // loads when the first connection arrives and takes every connection over.
  let h2: Http2Server | undefined;
  const h2sessions = new Set<ServerHttp2Session>();
  const http2Server = (): Http2Server => {
    if (h2) return h2;
    const { createServer } = process.getBuiltinModule("node:http2");
    h2 = createServer(
      {
        settings: { initialWindowSize: WINDOW_SIZE, maxFrameSize: MAX_FRAME_SIZE },
        // Upload frames still in flight when a caller cancels count as invalid; Node's default
        // (1000) would end the connection after a few cancelled uploads.
        maxSessionInvalidFrames: 1_000_000,
        maxSessionRejectedStreams: 1_000_000,
        // MB of outbound data a connection may hold. Chunks written to streams that callers then
        // cancel are released late; at Node's default (10) a few cancelled downloads make the
        // connection refuse new calls with ENHANCE_YOUR_CALM.
        maxSessionMemory: 256,
      },
      handler,
    );
    h2.on("session", (s) => {
      // Uploads: let the client keep a few chunks in flight instead of one 64 KiB window.
      s.once("localSettings", () => s.setLocalWindowSize(CONNECTION_WINDOW_SIZE));
      h2sessions.add(s);
      s.once("close", () => h2sessions.delete(s));
    });
    h2.on("sessionError", (err) => log("http2 session error", err));
    return h2;
  };
  const listeners: Server[] = [];
  const listen = (where: { path: string } | { port: number; host: string }) => {
    const server = createNetServer((socket) => http2Server().emit("connection", socket));
    listeners.push(server);
    return new Promise<Server>((resolve, reject) => {
      server.once("error", reject);
      server.listen(where, () => {
        server.off("error", reject);
        resolve(server);
      });
    });
  };

  await clearStaleSocket(options.socketPath);
  await listen({ path: options.socketPath });
  const tunnelPath = options.tunnelSocketPath ?? tunnelSocketBeside(options.socketPath);
  await clearStaleSocket(tunnelPath);
  const { server: tunnel, destroyAll: endTunnels } = createTunnelServer(options.secret, log);
  await new Promise<void>((resolve, reject) => {
    tunnel.once("error", reject);
    tunnel.listen(tunnelPath, () => {
      tunnel.off("error", reject);
      resolve();
    });
  });
  listeners.push(tunnel);
  let port: number | undefined;
  if (options.port !== undefined) {
    const addr = (await listen({ port: options.port, host: options.host ?? "0.0.0.0" })).address();
    port = typeof addr === "object" && addr ? addr.port : options.port;
  }

  if (options.preload) {
    setImmediate(() => {
      http2Server();
      loadRpc().then(
        (h) => h.preload(["sandbar.agent.v1.InfoService", "sandbar.agent.v1.FileService", "sandbar.agent.v1.ProcessService"]),
        (err: unknown) => log("preload failed", err),
      );
    });
  }

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      shutdown.abort();
      const closed = listeners.map((s) => new Promise<void>((resolve) => s.close(() => resolve())));
      await Promise.allSettled([areas.sessions?.closeAll(SHUTDOWN_GRACE_MS), areas.ptys?.closeAll(), areas.lsps?.closeAll()]);
      endTunnels();
      for (const s of h2sessions) s.close();
      const forced = setTimeout(() => {
        for (const s of h2sessions) s.destroy();
      }, 1000);
      await Promise.all(closed);
      clearTimeout(forced);
      await unlink(options.socketPath).catch(() => undefined);
      await unlink(tunnelPath).catch(() => undefined);
      if (ownStateDir) await rm(stateDir, { recursive: true, force: true });
    })());

  return { socketPath: options.socketPath, port, context: ctx, close };
}
