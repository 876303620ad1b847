import type { IPty } from "node-pty";
import { stat } from "node:fs/promises";
import { constants } from "node:os";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";
import { signalTree } from "../util/kill.ts";
import { asUserProcess } from "../process/user-spawn.ts";
import { resolvePath } from "../util/paths.ts";
import { envProblem } from "../util/shell.ts";

/** What a connected client receives. */
export type PtyEventOut = { case: "connected" } | { case: "data"; value: Uint8Array } | { case: "exit"; exitCode: number; exitReason: string };

/** Output chunks a client may fall behind by before it is dropped. */
const CLIENT_QUEUE = 256;

let ptyModule: Promise<typeof import("node-pty")> | undefined;
/** node-pty is native: loaded on the first terminal, never at start. */
const loadPty = () => (ptyModule ??= import("node-pty"));

/** One attached client: a bounded queue drained by its stream. */
class PtyClient {
  queue: PtyEventOut[] = [];
  failed: Error | undefined;
  ended = false;
  private wake: (() => void) | undefined;

  push(ev: PtyEventOut): void {
    if (this.ended) return;
    if (this.queue.length >= CLIENT_QUEUE && ev.case === "data") {
      this.failed = errors.resourceExhausted("slow consumer: the terminal's output outran this client, which was disconnected");
      this.ended = true;
    } else {
      this.queue.push(ev);
      if (ev.case === "exit") this.ended = true;
    }
    this.wake?.();
  }

  async *events(signal: AbortSignal): AsyncGenerator<PtyEventOut> {
    const onAbort = () => this.wake?.();
    signal.addEventListener("abort", onAbort);
    try {
      for (;;) {
        while (this.queue.length > 0) yield this.queue.shift()!;
        if (this.failed) throw this.failed;
        if (this.ended || signal.aborted) return;
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }
}

function exitReason(exitCode: number, signal: number): string {
  if (signal === constants.signals.SIGINT) return "Ctrl+C";
  if (signal === constants.signals.SIGKILL) return "SIGKILL";
  if (signal === constants.signals.SIGTERM) return "SIGTERM";
  if (signal > 0) return `signal ${signal}`;
  return exitCode === 0 ? "" : "non-zero exit";
}

export class PtySession {
  readonly id: string;
  readonly cwd: string;
  readonly envs: Record<string, string>;
  readonly lazyStart: boolean;
  readonly createdAt = new Date();
  cols: number;
  rows: number;
  private pty: IPty | undefined;
  private starting: Promise<void> | undefined;
  private readonly clients = new Set<PtyClient>();
  private exit: { exitCode: number; exitReason: string } | undefined;
  private readonly ctx: AgentContext;
  private readonly onGone: () => void;

  constructor(ctx: AgentContext, id: string, cwd: string, envs: Record<string, string>, cols: number, rows: number, lazyStart: boolean, onGone: () => void) {
    this.ctx = ctx;
    this.id = id;
    this.cwd = cwd;
    this.envs = envs;
    this.cols = cols;
    this.rows = rows;
    this.lazyStart = lazyStart;
    this.onGone = onGone;
  }

  get active(): boolean {
    return this.pty !== undefined && this.exit === undefined;
  }

  start(): Promise<void> {
    return (this.starting ??= (async () => {
      const { spawn } = await loadPty();
      const env: Record<string, string> = {};
      for (const [k, v] of Object.entries(this.ctx.env)) if (v !== undefined) env[k] = v;
      // The terminal type is this terminal's, not the agent's: xterm-256color unless the caller says.
      env.TERM = "xterm-256color";
      Object.assign(env, this.envs);
      const [file, args] = asUserProcess(this.ctx.shell, ["-i", "-l"], env);
      const pty = spawn(file, args, { name: env.TERM, cols: this.cols, rows: this.rows, cwd: this.cwd, env, encoding: null });
      this.pty = pty;
      pty.onData((data: string | Buffer) => {
        const bytes = typeof data === "string" ? Buffer.from(data) : data;
        for (const c of this.clients) c.push({ case: "data", value: bytes });
      });
      pty.onExit(({ exitCode, signal }) => {
        const sig = signal ?? 0;
        this.exit = { exitCode: sig > 0 ? 128 + sig : exitCode, exitReason: exitReason(exitCode, sig) };
        for (const c of this.clients) c.push({ case: "exit", ...this.exit });
        this.clients.clear();
        this.onGone();
      });
    })());
  }

  /** Attaches a client: connected, output as it comes, then the exit. */
  async *connect(signal: AbortSignal): AsyncGenerator<PtyEventOut> {
    if (this.exit) throw errors.failedPrecondition(`terminal ${this.id} has exited`);
    const client = new PtyClient();
    this.clients.add(client);
    try {
      if (!this.pty) await this.start();
      yield { case: "connected" };
      yield* client.events(signal);
    } finally {
      this.clients.delete(client);
    }
  }

  write(data: Uint8Array): void {
    if (!this.active) throw errors.failedPrecondition(this.exit ? `terminal ${this.id} has exited` : `terminal ${this.id} has not started: connect to it first`);
    this.pty!.write(Buffer.from(data.buffer, data.byteOffset, data.length));
  }

  resize(cols: number, rows: number): void {
    if (this.exit) throw errors.failedPrecondition(`terminal ${this.id} has exited`);
    this.cols = cols;
    this.rows = rows;
    this.pty?.resize(cols, rows);
  }

  /** Kills the shell and everything it started. */
  kill(): void {
    if (this.pty && !this.exit) {
      signalTree(this.pty.pid, "SIGKILL");
      try {
        this.pty.kill("SIGKILL");
      } catch {
        // Already gone.
      }
    } else if (!this.pty) {
      this.onGone();
    }
  }
}

function checkSize(cols: number, rows: number): void {
  if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000) throw errors.invalidArgument(`cols and rows must be 1..1000 (got ${cols}x${rows})`);
}

/** The agent's terminals, by the ids their callers chose. */
export class PtyManager {
  private readonly sessions = new Map<string, PtySession>();
  private readonly ctx: AgentContext;

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
  }

  async create(req: { id: string; cwd?: string; envs: Record<string, string>; cols?: number; rows?: number; lazyStart: boolean }): Promise<PtySession> {
    if (req.id.trim() === "") throw errors.invalidArgument("id is required");
    if (this.sessions.has(req.id)) throw errors.alreadyExists(`terminal already exists: ${req.id}`);
    const cols = req.cols ?? 80;
    const rows = req.rows ?? 24;
    checkSize(cols, rows);
    const badEnv = envProblem(req.envs);
    if (badEnv) throw errors.invalidArgument(badEnv);
    const cwd = req.cwd ? resolvePath(this.ctx.workDir, req.cwd, "cwd") : this.ctx.workDir;
    const st = await stat(cwd).catch(() => undefined);
    if (!st) throw errors.notFound(`cwd not found: ${cwd}`);
    if (!st.isDirectory()) throw errors.invalidArgument(`cwd is not a directory: ${cwd}`);
    if (this.sessions.has(req.id)) throw errors.alreadyExists(`terminal already exists: ${req.id}`);
    const session: PtySession = new PtySession(this.ctx, req.id, cwd, req.envs, cols, rows, req.lazyStart, () => {
      if (this.sessions.get(req.id) === session) this.sessions.delete(req.id);
    });
    this.sessions.set(req.id, session);
    if (!req.lazyStart) {
      try {
        await session.start();
      } catch (err) {
        this.sessions.delete(req.id);
        throw errors.internal(`cannot start the terminal: ${(err as Error).message}`);
      }
    }
    return session;
  }

  get(id: string): PtySession {
    const s = this.sessions.get(id);
    if (!s) throw errors.notFound(`terminal not found: ${id}`);
    return s;
  }

  list(): PtySession[] {
    return [...this.sessions.values()];
  }

  resize(id: string, cols: number, rows: number): PtySession {
    checkSize(cols, rows);
    const s = this.get(id);
    s.resize(cols, rows);
    return s;
  }

  delete(id: string): void {
    const s = this.get(id);
    this.sessions.delete(id);
    s.kill();
  }

  async closeAll(): Promise<void> {
    for (const s of this.sessions.values()) s.kill();
    this.sessions.clear();
  }
}
