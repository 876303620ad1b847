import { spawn, execFile } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { open, rm, writeFile } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import * as path from "node:path";
import type { Readable, Writable } from "node:stream";
import { promisify } from "node:util";
import { constants } from "node:os";
import { errors } from "@sandbar/protocol";
import { shellQuote } from "../util/shell.ts";
import { terminateTree } from "../util/kill.ts";
import { asUserProcess } from "../process/user-spawn.ts";
import { diskFull, fsCall, saysDiskFull } from "../util/fs-errors.ts";
import { CommandLog, STDERR, STDOUT } from "./command-log.ts";
import type { StreamId } from "./command-log.ts";

const execFileP = promisify(execFile);

/** In each session's directory: `{"id": <the caller's session id>}`, for an agent restart. */
export const SESSION_FILE = "session.json";

/** A command of a session: its log on disk, its exit code once it has one. */
export class SessionCommand {
  readonly id: string;
  readonly command: string;
  readonly async: boolean;
  readonly suppressInputEcho: boolean;
  readonly log: CommandLog;
  exitCode: number | undefined;
  /** Resolves with the exit code once the command ended and its output is on disk. */
  readonly done: Promise<number>;
  /** The write end of the command's stdin FIFO (asynchronous commands only). */
  input: FileHandle | undefined;
  inputPath: string | undefined;
  stdoutDone = false;
  stderrDone = false;
  /** The exit code the shell reported on fd 3, before the output is known to be drained. */
  reportedCode: number | undefined;
  private resolveDone!: (code: number) => void;

  constructor(id: string, command: string, async: boolean, suppressInputEcho: boolean, logFile: string) {
    this.id = id;
    this.command = command;
    this.async = async;
    this.suppressInputEcho = suppressInputEcho;
    this.log = new CommandLog(logFile);
    this.done = new Promise((resolve) => (this.resolveDone = resolve));
  }

  get finished(): boolean {
    return this.exitCode !== undefined;
  }

  /** Records the exit code once the output is on disk (and on disk too, for an agent restart). */
  async finish(code: number): Promise<void> {
    if (this.exitCode !== undefined) return;
    await this.log.end();
    this.exitCode = code;
    this.resolveDone(code);
    await writeFile(this.log.file.replace(/\.log$/, ".exit"), String(code), { mode: 0o600 }).catch(() => undefined);
  }

  /** A command an earlier agent ran: its log as written, its exit code (-1 when it never got one). */
  static fromDisk(dir: string, id: string): SessionCommand | undefined {
    let meta: { command?: unknown; async?: unknown; suppressInputEcho?: unknown };
    try {
      meta = JSON.parse(readFileSync(path.join(dir, `${id}.json`), "utf8")) as typeof meta;
    } catch {
      return undefined;
    }
    const cmd = new SessionCommand(id, String(meta.command ?? ""), meta.async === true, meta.suppressInputEcho === true, path.join(dir, `${id}.log`));
    const code = Number.parseInt(readOr(path.join(dir, `${id}.exit`), "-1"), 10);
    cmd.log.committed = sizeOr0(cmd.log.file);
    cmd.log.ended = true;
    cmd.exitCode = Number.isNaN(code) ? -1 : code;
    cmd.resolveDone(cmd.exitCode);
    return cmd;
  }
}

function readOr(file: string, fallback: string): string {
  try {
    return readFileSync(file, "utf8").trim();
  } catch {
    return fallback;
  }
}

function sizeOr0(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}

/**
 * Finds an end-of-command token in a byte stream. A chunk ending with the
 * token's beginning holds those bytes back until the next chunk decides.
 */
class TokenScanner {
  private readonly token: Buffer;
  private carry: Buffer | undefined;

  constructor(token: Buffer) {
    this.token = token;
  }

  /** Splits a chunk into output before the token, whether the token was seen, and output after it. */
  scan(chunk: Buffer): { before: Buffer; seen: boolean; after: Buffer } {
    const data = this.carry ? Buffer.concat([this.carry, chunk]) : chunk;
    this.carry = undefined;
    const at = data.indexOf(this.token);
    if (at >= 0) {
      return { before: data.subarray(0, at), seen: true, after: this.holdBack(data.subarray(at + this.token.length)) };
    }
    return { before: this.holdBack(data), seen: false, after: Buffer.alloc(0) };
  }

  private holdBack(data: Buffer): Buffer {
    const first = this.token[0];
    const from = Math.max(0, data.length - this.token.length + 1);
    for (let i = data.indexOf(first, from); i >= 0; i = data.indexOf(first, i + 1)) {
      if (this.token.subarray(0, data.length - i).equals(data.subarray(i))) {
        this.carry = Buffer.from(data.subarray(i));
        return data.subarray(0, i);
      }
    }
    return data;
  }
}

export interface SessionOptions {
  id: string;
  dir: string;
  shell: string;
  cwd: string;
  env: NodeJS.ProcessEnv;
  log: (message: string, err?: unknown) => void;
}

/**
 * One long-lived shell whose stdin the agent owns. Each command is written to
 * a file and sourced by the shell inside a wrapper, so cd, export, variables
 * and functions persist; commands run one after another. The wrapper prints a
 * per-session token on stdout and stderr and the exit code on fd 3, which is
 * how the agent knows where a command's output ends.
 */
export class Session {
  readonly id: string;
  readonly dir: string;
  readonly commands = new Map<string, SessionCommand>();
  private readonly shell: ChildProcess;
  private readonly token: Buffer;
  private readonly tokenText: string;
  private readonly queue: SessionCommand[] = [];
  private current: SessionCommand | undefined;
  private last: SessionCommand | undefined;
  private readonly scanners: Record<StreamId, TokenScanner>;
  private controlText = "";
  private exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly exited: Promise<void>;
  private deleting = false;
  private readonly logError: (message: string, err?: unknown) => void;

  constructor(opts: SessionOptions) {
    this.id = opts.id;
    this.dir = opts.dir;
    this.logError = opts.log;
    this.tokenText = randomBytes(16).toString("hex");
    this.token = Buffer.from(`\x1f${this.tokenText}\x1e`, "latin1");
    this.scanners = { [STDOUT]: new TokenScanner(this.token), [STDERR]: new TokenScanner(this.token) };
    const [file, args] = asUserProcess(opts.shell, [], opts.env);
    this.shell = spawn(file, args, {
      cwd: opts.cwd,
      env: opts.env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe", "pipe"],
    });
    this.exited = new Promise((resolve) => {
      this.shell.once("error", (err) => {
        this.logError(`session ${this.id}: shell failed`, err);
        this.onExit(null, null);
        resolve();
      });
      this.shell.once("exit", (code, signal) => {
        this.onExit(code, signal);
        resolve();
      });
    });
    this.pipeOutput(this.shell.stdout!, STDOUT);
    this.pipeOutput(this.shell.stderr!, STDERR);
    const control = this.shell.stdio[3] as Readable;
    control.setEncoding("latin1");
    control.on("data", (text: string) => this.onControl(text));
    control.on("error", () => undefined);
    this.shell.stdin!.on("error", () => undefined);
    this.shell.stdin!.write("exec 7>&1 8>&2 9>&3 3>&-\n");
  }

  get alive(): boolean {
    return this.exitInfo === undefined;
  }

  /** Resolves once the shell has exited (its running command finished with the shell's status). */
  get ended(): Promise<void> {
    return this.exited;
  }

  /** The same session with a new shell, after this one's was killed: its commands and logs go on. */
  renewed(opts: Omit<SessionOptions, "id" | "dir">): Session {
    const fresh = new Session({ ...opts, id: this.id, dir: this.dir });
    for (const [id, cmd] of this.commands) fresh.commands.set(id, cmd);
    fresh.last = this.last;
    return fresh;
  }

  /**
   * After an agent restart: the commands the session ran before, from its directory, oldest
   * first. Their processes ended with the old agent (their pipes ended in it); this session's
   * shell is a new one (earlier cd, exports and variables are gone).
   */
  restoreCommands(): void {
    const ids: { id: string; at: number }[] = [];
    for (const f of readdirSync(this.dir)) {
      if (!f.endsWith(".json") || f === SESSION_FILE) continue;
      ids.push({ id: f.slice(0, -".json".length), at: statSync(path.join(this.dir, f)).mtimeMs });
    }
    for (const { id } of ids.sort((a, b) => a.at - b.at)) {
      const cmd = SessionCommand.fromDisk(this.dir, id);
      if (cmd) {
        this.commands.set(id, cmd);
        this.last = cmd;
      }
    }
  }

  /** Starts a command (queued behind a running one). */
  async execute(command: string, async: boolean, suppressInputEcho: boolean): Promise<SessionCommand> {
    if (this.deleting) throw errors.failedPrecondition(`session ${this.id} is being deleted`);
    if (!this.alive) throw errors.failedPrecondition(`the shell of session ${this.id} has exited; delete the session and create it again`);
    const id = randomUUID();
    const cmd = new SessionCommand(id, command, async, suppressInputEcho, path.join(this.dir, `${id}.log`));
    // The session's files are on the sandbox's disk: a full one is the caller's to hear about.
    const script = path.join(this.dir, `${id}.sh`);
    await fsCall(script, () => writeFile(script, command + "\n", { mode: 0o600 }));
    const meta = path.join(this.dir, `${id}.json`);
    await fsCall(meta, () => writeFile(meta, JSON.stringify({ command, async, suppressInputEcho }), { mode: 0o600 }));
    if (async) {
      // A FIFO as stdin, held open by the agent so later input can be written to it.
      const fifo = path.join(this.dir, `${id}.in`);
      cmd.inputPath = fifo;
      await execFileP("mkfifo", ["-m", "600", fifo]).catch((err: unknown) => {
        throw saysDiskFull(String((err as { stderr?: unknown }).stderr ?? "")) ? diskFull(fifo) : err;
      });
      cmd.input = await fsCall(fifo, () => open(fifo, "r+"));
    }
    this.commands.set(id, cmd);
    this.queue.push(cmd);
    this.startNext();
    return cmd;
  }

  /** Writes a line to a running asynchronous command's stdin. */
  async sendInput(cmd: SessionCommand, data: string): Promise<void> {
    if (!this.alive || cmd.finished) throw errors.failedPrecondition(`command ${cmd.id} has already exited`);
    if (!cmd.input) throw errors.failedPrecondition(`command ${cmd.id} was not started asynchronously, so it takes no input`);
    const line = data.endsWith("\n") ? data : data + "\n";
    // Echo first: the command may answer (and exit) as soon as it reads the line.
    if (!cmd.suppressInputEcho) cmd.log.append(STDOUT, Buffer.from(line));
    await cmd.input.write(line);
  }

  /** Kills the shell and everything it started, ends every command and removes the logs. */
  async delete(graceMs: number): Promise<void> {
    this.deleting = true;
    if (this.alive && this.shell.pid !== undefined) await terminateTree(this.shell.pid, graceMs);
    await this.exited;
    await rm(this.dir, { recursive: true, force: true });
  }

  private startNext(): void {
    if (this.current || !this.alive) return;
    const cmd = this.queue.shift();
    if (!cmd) return;
    this.current = cmd;
    this.last = cmd;
    const stdin = cmd.inputPath ? shellQuote(cmd.inputPath) : "/dev/null";
    const script = shellQuote(path.join(this.dir, `${cmd.id}.sh`));
    // The session's own output and control fds are 7, 8 (copies of stdout and
    // stderr) and 9; the command gets stdout and stderr from them and never sees
    // them. The group's redirections are undone after it, so a command's
    // `exec >file` or closed fd cannot break the session.
    const wrapper =
      `{ . ${script}; } <${stdin} >&7 2>&8 7>&- 8>&- 9>&-; __sandbar_ec=$?; ` +
      `printf '\\037%s\\036' ${this.tokenText} >&7; printf '\\037%s\\036' ${this.tokenText} >&8; ` +
      `printf '%s\\n' "$__sandbar_ec" >&9\n`;
    (this.shell.stdin as Writable).write(wrapper);
  }

  private pipeOutput(stream: Readable, id: StreamId): void {
    stream.on("error", () => undefined);
    stream.on("data", (chunk: Buffer) => {
      const { before, seen, after } = this.scanners[id].scan(chunk);
      const target = this.current ?? this.last;
      if (target && !target.finished) {
        target.log.append(id, before);
        target.log.append(id, after);
        if (target.log.full) {
          // Backpressure: stop reading until the log has caught up with the disk.
          stream.pause();
          target.log.once("drain", () => stream.resume());
        }
      }
      if (seen && this.current) {
        if (id === STDOUT) this.current.stdoutDone = true;
        else this.current.stderrDone = true;
        this.maybeComplete();
      }
    });
  }

  private onControl(text: string): void {
    this.controlText += text;
    for (;;) {
      const nl = this.controlText.indexOf("\n");
      if (nl < 0) break;
      const line = this.controlText.slice(0, nl);
      this.controlText = this.controlText.slice(nl + 1);
      const cmd = this.current;
      if (!cmd) continue;
      const code = Number.parseInt(line, 10);
      cmd.reportedCode = Number.isNaN(code) ? -1 : code;
      this.maybeComplete();
    }
  }

  private maybeComplete(): void {
    const cmd = this.current;
    if (!cmd || !cmd.stdoutDone || !cmd.stderrDone || cmd.reportedCode === undefined) return;
    const code = cmd.reportedCode;
    this.current = undefined;
    void this.closeInput(cmd);
    void cmd.finish(code);
    this.startNext();
  }

  private async closeInput(cmd: SessionCommand): Promise<void> {
    const fh = cmd.input;
    cmd.input = undefined;
    await fh?.close().catch(() => undefined);
    if (cmd.inputPath) await rm(cmd.inputPath, { force: true });
  }

  private onExit(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exitInfo) return;
    this.exitInfo = { code, signal };
    const shellCode = code ?? 128 + signalNumber(signal);
    const running = this.current;
    this.current = undefined;
    const ended = [...(running ? [running] : []), ...this.queue.splice(0)];
    for (const cmd of ended) {
      void this.closeInput(cmd);
      // The running command gets the shell's exit status (e.g. after `exit 3`); queued ones never ran.
      void cmd.finish(cmd === running ? shellCode : -1);
    }
  }
}

function signalNumber(signal: NodeJS.Signals | null): number {
  return signal ? (constants.signals[signal] ?? 0) : 0;
}
