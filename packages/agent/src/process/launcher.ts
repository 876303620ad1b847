import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import * as path from "node:path";
import type { Writable } from "node:stream";
import type { AgentContext } from "../context.ts";
import { shellQuote } from "../util/shell.ts";
import { asUserProcess, userJoinPrelude } from "./user-spawn.ts";

/** Longest script handed to a warm shell; bash reads it byte by byte. */
const WARM_SCRIPT_LIMIT = 16 * 1024;

/**
 * A bash started ahead of time that waits for its script on fd 3, then runs
 * it as `bash -c` would (eval as its last command: same exit status, same
 * syntax-error handling). Process creation is then off the critical path of
 * an execution.
 */
const WARM_BOOT = 'IFS= read -r -d "" __sandbar_script <&3 || exit 0; exec 3<&-; eval "$__sandbar_script"';

/**
 * Starts the shells that executions run in: each in its own process group,
 * stdin /dev/null, stdout and stderr piped. Keeps one warm bash spare once
 * executions have started (never before: an idle sandbox pays nothing).
 */
export class ShellLauncher {
  private spare: ChildProcess | undefined;
  /** The environment generation the spare was started with. */
  private spareGeneration = 0;
  private readonly ctx: AgentContext;
  private readonly warmable: boolean;

  constructor(ctx: AgentContext) {
    this.ctx = ctx;
    this.warmable = path.basename(ctx.shell) === "bash";
    ctx.shutdown.addEventListener("abort", () => this.spare?.kill("SIGKILL"), { once: true });
  }

  /** A shell running script in cwd, with envs added to the agent's environment. */
  launch(script: string, cwd: string, envs: Record<string, string>): ChildProcess {
    if (!this.warmable || script.length > WARM_SCRIPT_LIMIT || this.ctx.shutdown.aborted) return this.cold(script, cwd, envs);
    const warm = this.take();
    if (!warm) return this.cold(script, cwd, envs);
    let prelude = "";
    if (cwd !== this.ctx.workDir) prelude += `cd -- ${shellQuote(cwd)} || exit 1\n`;
    for (const [k, v] of Object.entries(envs)) prelude += `export ${k}=${shellQuote(v)}\n`;
    const fd3 = warm.stdio[3] as Writable;
    fd3.end(`${prelude}${script}\0`);
    return warm;
  }

  private cold(script: string, cwd: string, envs: Record<string, string>): ChildProcess {
    const env = Object.keys(envs).length ? { ...this.ctx.env, ...envs } : this.ctx.env;
    const [file, args] = asUserProcess(this.ctx.shell, ["-c", script], env);
    return spawn(file, args, { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  }

  private take(): ChildProcess | undefined {
    const s = this.spare;
    this.spare = undefined;
    if (!s || s.exitCode !== null || s.signalCode !== null) return undefined;
    if (this.spareGeneration !== this.ctx.envGeneration) {
      s.kill("SIGKILL"); // started before the environment changed
      return undefined;
    }
    s.ref();
    return s;
  }

  /**
   * Makes the next spare soon. Callers ask once their execution has answered:
   * spawning blocks the event loop for the length of a fork, which must not
   * delay an answer.
   */
  refillSoon(): void {
    if (this.warmable && !this.spare) setTimeout(() => this.refill(), 0);
  }

  private refill(): void {
    if (this.spare || this.ctx.shutdown.aborted) return;
    // The shell joins the user cgroup itself (no /bin/sh wrapper to exec first).
    const s = spawn(this.ctx.shell, ["-c", userJoinPrelude() + WARM_BOOT], { cwd: this.ctx.workDir, env: this.ctx.env, detached: true, stdio: ["ignore", "pipe", "pipe", "pipe"] });
    s.once("error", () => {
      if (this.spare === s) this.spare = undefined;
    });
    (s.stdio[3] as Writable).on("error", () => undefined);
    // A spare must not keep the agent alive or hold its output.
    s.unref();
    this.spare = s;
    this.spareGeneration = this.ctx.envGeneration;
  }
}
