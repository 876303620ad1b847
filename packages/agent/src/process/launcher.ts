import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import * as path from "node:path";
import type { Readable, Writable } from "node:stream";
import type { AgentContext } from "../context.ts";
import { shellQuote } from "../util/shell.ts";
import { ShellSpawner, type SpawnedShell } from "./shell-spawner.ts";
import { asUserProcess, userCgroupFiles, userJoinPrelude, userOomPrelude } from "./user-spawn.ts";

/** Longest script handed to a warm shell; bash reads it byte by byte. */
const WARM_SCRIPT_LIMIT = 16 * 1024;

/**
 * A bash started ahead of time that waits for its script on fd 3, then runs
 * it as `bash -c` would (eval as its last command: same exit status, same
 * syntax-error handling). Process creation is then off the critical path of
 * an execution.
 */
const WARM_BOOT = 'IFS= read -r -d "" __sandbar_script <&3 || exit 0; exec 3<&-; eval "$__sandbar_script"';

/** Warm shells kept ready while executions run: one being taken, the next arriving. */
const POOL = 2;
/** The spawner ends after this long without an execution, giving its memory back. */
const SPAWNER_IDLE_MS = 60_000;
/** A spawner that died is not restarted sooner than this (something keeps killing it). */
const SPAWNER_RETRY_MS = 5_000;

/** What an execution runs in: a ChildProcess, or a shell the spawner started (the same events). */
export interface LaunchedShell {
  readonly pid?: number | undefined;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  once(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): unknown;
  once(event: "error", listener: (err: Error) => void): unknown;
}

/** A warm shell waiting for its script on `input`. */
interface Spare {
  shell: LaunchedShell;
  input: Writable;
  /** The environment generation it was started with. */
  generation: number;
  alive(): boolean;
  /** Lets it keep the agent running once it runs a script. */
  hold(): void;
  discard(): void;
}

/**
 * Starts the shells that executions run in: each in its own process group,
 * stdin /dev/null, stdout and stderr piped. Once executions have started (never
 * before: an idle sandbox pays nothing) warm shells are kept ready, started by
 * the spawner process so that the agent never forks between two executions;
 * until the spawner runs (and after it ended idle) the agent keeps one spare
 * of its own.
 */
export class ShellLauncher {
  private readonly spares: Spare[] = [];
  /** The environment generation of each shell asked of the spawner that has not arrived, in order. */
  private readonly pending: number[] = [];
  private spawner: ShellSpawner | undefined;
  private spawnerStarted = 0;
  /** Shells launched (warm or cold) that have not exited. */
  private running = 0;
  private readonly idle: NodeJS.Timeout;
  private readonly ctx: AgentContext;
  private readonly warmable: boolean;

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
    this.warmable = path.basename(ctx.shell) === "bash";
    this.idle = setTimeout(() => this.stopSpawner(), SPAWNER_IDLE_MS);
    this.idle.unref();
    // A sandbox claimed from the warm pool gets its environment just before its first execution.
    ctx.envChanges.addEventListener("change", () => this.replaceStale());
    ctx.shutdown.addEventListener(
      "abort",
      () => {
        clearTimeout(this.idle);
        this.spawner?.stop();
        for (const s of this.spares.splice(0)) s.discard();
      },
      { once: true },
    );
  }

  /** A shell running script in cwd, with envs added to the agent's environment. */
  launch(script: string, cwd: string, envs: Record<string, string>): LaunchedShell {
    if (!this.warmable || script.length > WARM_SCRIPT_LIMIT || this.ctx.shutdown.aborted) return this.cold(script, cwd, envs);
    this.idle.refresh();
    const warm = this.take();
    const shell = warm ? this.start(warm, script, cwd, envs) : this.cold(script, cwd, envs);
    this.running++;
    shell.once("exit", () => this.running--);
    return shell;
  }

  private start(warm: Spare, script: string, cwd: string, envs: Record<string, string>): LaunchedShell {
    let prelude = "";
    if (cwd !== this.ctx.workDir) prelude += `cd -- ${shellQuote(cwd)} || exit 1\n`;
    for (const [k, v] of Object.entries(envs)) prelude += `export ${k}=${shellQuote(v)}\n`;
    warm.hold();
    warm.input.end(`${prelude}${script}\0`);
    return warm.shell;
  }

  private cold(script: string, cwd: string, envs: Record<string, string>): ChildProcess {
    const env = Object.keys(envs).length ? { ...this.ctx.env, ...envs } : this.ctx.env;
    const [file, args] = asUserProcess(this.ctx.shell, ["-c", script], env);
    return spawn(file, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  }

  private take(): Spare | undefined {
    let s: Spare | undefined;
    while ((s = this.spares.shift())) {
      if (s.alive() && s.generation === this.ctx.envGeneration) break;
      s.discard(); // ended meanwhile, or started before the environment changed
    }
    // A running spawner is asked now (a message). Starting one forks this process, 3-9 ms of a
    // sandbox's first execution: a lone execution leaves that to refillSoon, after its answer;
    // executions running side by side (a long first one) get it now, as they need spares.
    if (this.spawner?.alive || this.running > 0) this.askSpawner();
    return s;
  }

  /**
   * Makes sure spares are coming. Callers ask once their execution has answered: a fork in the
   * agent (its own spare, while no spawner runs) blocks the event loop, which must not delay an answer.
   */
  refillSoon(): void {
    if (!this.warmable || this.ctx.shutdown.aborted) return;
    if (this.askSpawner()) return;
    if (this.spares.length === 0) setTimeout(() => this.refillHere(), 0);
  }

  /** Asks the spawner (started if need be) for the shells missing from the pool; false if it cannot. */
  private askSpawner(): boolean {
    if (!this.warmable || this.ctx.shutdown.aborted) return false;
    if (!this.spawner?.alive) {
      if (Date.now() - this.spawnerStarted < SPAWNER_RETRY_MS) return false;
      this.spawnerStarted = Date.now();
      this.pending.length = 0;
      let failing = false;
      this.spawner = new ShellSpawner(
        userCgroupFiles(),
        (shell) => this.arrived(shell),
        (reason) => {
          this.pending.shift();
          // Once per spawner: a user's fork storm makes every request fail while it lasts.
          if (!failing) this.ctx.log(`the shell spawner could not start a shell (executions start their own meanwhile): ${reason}`);
          failing = true;
        },
      );
    }
    // Until the spawner says it joined the user cgroup, its shells join it themselves.
    const prelude = this.spawner.joined ? userOomPrelude() : userJoinPrelude();
    while (this.spares.length + this.pending.length < POOL) {
      if (!this.spawner.request({ file: this.ctx.shell, args: ["-c", prelude + WARM_BOOT], cwd: this.ctx.workDir, env: this.ctx.env })) return false;
      this.pending.push(this.ctx.envGeneration);
    }
    return true;
  }

  private arrived(shell: SpawnedShell): void {
    const generation = this.pending.shift() ?? -1;
    if (generation !== this.ctx.envGeneration) {
      // Asked for before the environment changed.
      kill(shell.pid);
      this.askSpawner();
      return;
    }
    const input = shell.input!;
    input.on("error", () => undefined);
    this.spares.push({
      shell,
      input,
      generation,
      alive: () => !shell.exited,
      hold: () => {
        shell.stdout?.ref();
        shell.stderr?.ref();
      },
      discard: () => kill(shell.pid),
    });
  }

  /** Ends the spares started with an environment that has changed since, and starts fresh ones. */
  private replaceStale(): void {
    const stale = this.spares.filter((s) => s.generation !== this.ctx.envGeneration);
    if (stale.length === 0) return;
    for (const s of stale) {
      this.spares.splice(this.spares.indexOf(s), 1);
      s.discard();
    }
    this.refillSoon();
  }

  private stopSpawner(): void {
    if (!this.spawner?.alive) return;
    this.spawner.stop();
    // Its shells ended with it; a spare the agent started itself must not be left waiting.
    for (const s of this.spares.splice(0)) s.discard();
    this.refillSoon();
  }

  /** One spare started by the agent itself. */
  private refillHere(): void {
    if (this.spares.length > 0 || this.ctx.shutdown.aborted) return;
    // The shell joins the user cgroup itself (no /bin/sh wrapper to exec first).
    const s = spawn(this.ctx.shell, ["-c", userJoinPrelude() + WARM_BOOT], { cwd: this.ctx.workDir, env: this.ctx.env, detached: true, stdio: ["ignore", "pipe", "pipe", "pipe"] });
    s.once("error", () => undefined);
    const input = s.stdio[3] as Writable;
    input.on("error", () => undefined);
    // A spare must not keep the agent alive or hold its output.
    s.unref();
    this.spares.push({
      shell: s,
      input,
      generation: this.ctx.envGeneration,
      alive: () => s.exitCode === null && s.signalCode === null && s.pid !== undefined,
      hold: () => s.ref(),
      discard: () => kill(s.pid),
    });
  }
}

function kill(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // Already gone.
  }
}
