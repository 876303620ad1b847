import { spawn } from "node:child_process";
import * as path from "node:path";
import type { Readable } from "node:stream";
import type { AgentContext } from "../context.ts";
import { shellQuote } from "../util/shell.ts";
import { SubshellHost } from "./subshell-host.ts";
import { asUserProcess, userJoinPrelude } from "./user-spawn.ts";

/** Longest script sent to a host; bash reads it byte by byte. Longer ones get a shell of their own. */
const HOST_SCRIPT_LIMIT = 16 * 1024;
/** Below this many free slots the next host is started, so one is ready when these run out. */
const LOW_SLOTS = 4;
/**
 * Hosts end after this long without an execution. One costs about 0.3 MB of private memory and
 * two of the user's pids, so it stays a while: a warm-pool sandbox claimed minutes after its
 * warm-up still runs its first execution in a subshell.
 */
const IDLE_MS = 10 * 60_000;
/**
 * Variables a new bash acts on as it starts that a subshell cannot be given: its read-only ones
 * (taken from the environment at start, refused by an export) and BASH_ENV (sourced at start).
 * An execution setting one gets a shell of its own; an environment change setting one retires the
 * hosts (the next ones start with it).
 */
const SHELL_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const AT_START = new Set(["BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID", "BASH_ENV"]);
/** `$$`, `${$}` and `$PPID` name the host in a subshell: such scripts get a shell of their own. */
const NEEDS_OWN_SHELL = /\$\{?\$|PPID|\0/;

/**
 * After a host could not fork an execution in time (the user's pids are full: a fork storm),
 * executions go straight to shells of the agent's own for this long: the agent forks them from
 * its reserve, where each one more host would first hold an execution for a second.
 */
const BYPASS_MS = 10_000;

/** What an execution runs in: a ChildProcess, or a subshell of a host (the same events). */
export interface LaunchedShell {
  readonly pid?: number | undefined;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  once(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): unknown;
  once(event: "error", listener: (err: Error) => void): unknown;
}

/**
 * Starts the shells that executions run in, each its own process group, stdin /dev/null, output
 * piped. Once executions have started (never before: an idle sandbox pays nothing) they run in
 * subshells of a resident bash (subshell-host.ts), so no execution waits for a process to be
 * created and the agent forks once per host, not per execution. An execution goes to the
 * sequential host when it is free (one fork: its subshell), else to a job-running host (two
 * forks, any number at once), kept once executions have run side by side. Until a host runs,
 * and for scripts a subshell cannot run as `bash -c` would, the agent starts a shell of its own.
 */
export class ShellLauncher {
  /** Takes executions one at a time, one fork each: the first choice while it is free. */
  private sequential: SubshellHost | undefined;
  /** The next sequential host, started ahead while the current one's slots run low. */
  private spareSequential: SubshellHost | undefined;
  /** Job-running hosts (two forks each, any number at once): for executions side by side. */
  private current: SubshellHost | undefined;
  private next: SubshellHost | undefined;
  /** An execution found the sequential host busy: job-running hosts are kept from then on. */
  private concurrent = false;
  /** Until then (ms since the epoch) executions skip the hosts: one could not fork in time. */
  private bypassUntil = 0;
  private readonly idle: NodeJS.Timeout;
  private readonly ctx: AgentContext;
  private readonly hostable: boolean;
  /** The exports bringing a host's environment up to ctx.env, per host, for one env generation. */
  private readonly envPreludes = new WeakMap<SubshellHost, { generation: number; text: string }>();

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
    this.hostable = path.basename(ctx.shell) === "bash";
    this.idle = setTimeout(() => this.stopHosts(), IDLE_MS);
    this.idle.unref();
    ctx.shutdown.addEventListener("abort", () => {
      clearTimeout(this.idle);
      this.stopHosts();
    }, { once: true });
  }

  /** A shell running script in cwd, with envs added to the agent's environment. */
  async launch(script: string, cwd: string, envs: Record<string, string>): Promise<LaunchedShell> {
    if (!this.hostable || script.length > HOST_SCRIPT_LIMIT || NEEDS_OWN_SHELL.test(script) || this.ctx.shutdown.aborted) return this.own(script, cwd, envs);
    if (Object.keys(envs).some((k) => AT_START.has(k)) || Date.now() < this.bypassUntil) return this.own(script, cwd, envs);
    this.idle.refresh();
    const host = this.freeSequential() ?? this.host();
    if (!host) return this.own(script, cwd, envs);
    const env = this.envPrelude(host);
    if (env === undefined) {
      this.stopHosts(); // started before a change no subshell can take
      return this.own(script, cwd, envs);
    }
    // Always cd: the host's own cwd may be a work dir that was removed and made again since.
    let prelude = `${env}cd -- ${shellQuote(cwd)} || exit 1\n`;
    for (const [k, v] of Object.entries(envs)) prelude += `export ${k}=${shellQuote(v)}\n`;
    // Undefined: the host died before running it (killed by the user, or stalled); nothing ran.
    const shell = await host.run(`${prelude}${script}`);
    if (shell) return shell;
    if (host.stalled) this.bypassUntil = Date.now() + BYPASS_MS;
    return this.own(script, cwd, envs);
  }

  /**
   * Makes sure a host is ready, or the next one coming. Callers ask once their execution has
   * answered: starting a host forks this process, which blocks the event loop.
   */
  refillSoon(): void {
    if (!this.hostable || this.ctx.shutdown.aborted || Date.now() < this.bypassUntil) return;
    const sequentialReady = this.sequential?.free && (this.sequential.free >= LOW_SLOTS || this.spareSequential?.free);
    if (sequentialReady && (!this.concurrent || (this.current?.free && (this.current.free >= LOW_SLOTS || this.next?.free)))) return;
    setImmediate(() => {
      if (this.ctx.shutdown.aborted) return;
      this.promoteSequential();
      if (!this.sequential?.free) this.sequential = this.start(true);
      else if (this.sequential.free < LOW_SLOTS && !this.spareSequential?.free) this.spareSequential = this.start(true);
      if (!this.concurrent) return;
      if (!this.host()) this.current = this.start();
      else if (this.current!.free < LOW_SLOTS && !this.next?.free) this.next = this.start();
    });
  }

  /** The sequential host if it can take an execution now; noting executions side by side. */
  private freeSequential(): SubshellHost | undefined {
    this.promoteSequential();
    const s = this.sequential;
    if (s?.busy) this.concurrent = true;
    return s?.free && !s.busy ? s : undefined;
  }

  private promoteSequential(): void {
    if (!this.sequential?.free && this.spareSequential?.free) {
      this.sequential = this.spareSequential;
      this.spareSequential = undefined;
    }
  }

  /** The job-running host with a free slot, the next one once the current is used up. */
  private host(): SubshellHost | undefined {
    if (!this.current?.free && this.next?.free) {
      this.current = this.next;
      this.next = undefined;
    }
    return this.current?.free ? this.current : undefined;
  }

  private start(sequential = false): SubshellHost {
    // The host joins the user cgroup itself and its subshells are born there; one that cannot
    // join (the user's pids are full) ends, and executions start shells of their own meanwhile.
    return new SubshellHost({ shell: this.ctx.shell, cwd: this.ctx.workDir, env: this.ctx.env, prelude: userJoinPrelude(true), sequential });
  }

  /** The exports bringing host's environment up to ctx.env; undefined if a subshell cannot take them. */
  private envPrelude(host: SubshellHost): string | undefined {
    const cached = this.envPreludes.get(host);
    if (cached?.generation === this.ctx.envGeneration) return cached.text;
    let text = "";
    for (const [k, v] of Object.entries(this.ctx.env)) {
      if (v === undefined || host.env[k] === v) continue;
      if (AT_START.has(k)) return undefined;
      text += `export ${k}=${shellQuote(v)}\n`;
    }
    // Variables EnvironmentService unset since the host started.
    for (const k of Object.keys(host.env)) {
      if (this.ctx.env[k] !== undefined) continue;
      if (AT_START.has(k) || !SHELL_NAME.test(k)) return undefined;
      text += `unset ${k}\n`;
    }
    this.envPreludes.set(host, { generation: this.ctx.envGeneration, text });
    return text;
  }

  /** A bash of its own for one script, joining the user cgroup through a wrapper. */
  private own(script: string, cwd: string, envs: Record<string, string>): LaunchedShell {
    const env = Object.keys(envs).length ? { ...this.ctx.env, ...envs } : this.ctx.env;
    const [file, args] = asUserProcess(this.ctx.shell, ["-c", script], env);
    return spawn(file, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  }

  private stopHosts(): void {
    this.sequential?.retire();
    this.spareSequential?.retire();
    this.current?.stop();
    this.next?.stop();
    this.sequential = this.spareSequential = this.current = this.next = undefined;
  }
}

