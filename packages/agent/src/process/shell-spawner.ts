/**
 * A small node process beside the agent that starts the warm shells executions run in and hands
 * their pipes to the agent over its IPC channel (stdio pipes are socket pairs, which node passes
 * as handles). A fork copies the forking process's page tables and blocks its event loop meanwhile:
 * 1-1.5 ms for the agent, on the critical path of the next call in a run of executions; the
 * spawner pays it on its own loop, on the other core. The spawner stays the shells' parent, so
 * it reports their exits too.
 *
 * The spawner lives in the user cgroup, so its shells are born there: moving a process between
 * cgroups costs about 0.3 ms per hierarchy (five with cgroup v1), which every shell the agent
 * starts pays. It keeps the agent's oom_score_adj (-1000: the OOM killer never picks it) and counts
 * against the user's memory and pids; when the user's budget is exhausted it fails to start shells,
 * and the agent starts its own.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";

/** The spawner's whole program, run with `node -e`: plain JavaScript, no imports of ours. */
const SPAWNER = `
const { spawn } = require("node:child_process");
const { writeFileSync } = require("node:fs");
let joined = true;
for (const f of JSON.parse(process.argv[1])) {
  try { writeFileSync(f, "0"); } catch { joined = false; }
}
const send = (msg, handle) => process.send(msg, handle, (err) => { if (err) process.exit(1); });
process.on("disconnect", () => process.exit(0));
send({ joined });
process.on("message", (m) => {
  let c;
  try {
    c = spawn(m.file, m.args, { cwd: m.cwd, env: m.env, detached: true, stdio: ["ignore", "pipe", "pipe", "pipe"] });
  } catch (err) {
    return send({ failed: String(err && err.message) });
  }
  c.once("error", (err) => send({ failed: err.message }));
  if (c.pid === undefined) return;
  const pid = c.pid;
  send({ pid, fd: 1 }, c.stdout);
  send({ pid, fd: 2 }, c.stderr);
  send({ pid, fd: 3 }, c.stdio[3]);
  c.once("exit", (code, signal) => send({ pid, code, signal }));
});
`;

/** What the agent asks for: one process, as `spawn(file, args, { cwd, env })` would start it. */
export interface ShellRequest {
  file: string;
  args: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
}

type Message = { joined: boolean } | { failed: string } | { pid: number; fd: 1 | 2 | 3 } | { pid: number; code: number | null; signal: NodeJS.Signals | null };

/**
 * A shell the spawner started: its pipes, held here, and its exit as a ChildProcess reports it
 * ("exit" with code and signal).
 */
export class SpawnedShell extends EventEmitter {
  readonly pid: number;
  stdout: Socket | null = null;
  stderr: Socket | null = null;
  input: Socket | null = null;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;

  constructor(pid: number) {
    super();
    this.pid = pid;
  }

  get complete(): boolean {
    return this.stdout !== null && this.stderr !== null && this.input !== null;
  }

  get exited(): boolean {
    return this.exitCode !== null || this.signalCode !== null;
  }

  exit(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exited) return;
    this.exitCode = code;
    this.signalCode = signal ?? (code === null ? "SIGKILL" : null);
    this.emit("exit", this.exitCode, this.signalCode);
  }
}

/** The agent's side of one spawner process. */
export class ShellSpawner {
  readonly #child: ChildProcess;
  /** Shells whose pipes have not all arrived, then every live one: exits are reported by pid. */
  readonly #shells = new Map<number, SpawnedShell>();
  /** Whether the spawner joined the user cgroup (its shells are born there); unknown until it says. */
  joined: boolean | undefined;
  readonly #ready: (shell: SpawnedShell) => void;
  readonly #failed: (reason: string) => void;
  #alive = true;

  /**
   * `userCgroup`: the procs files to join; `ready`: a shell with all its pipes; `failed`: a
   * request that started nothing.
   */
  constructor(userCgroup: readonly string[], ready: (shell: SpawnedShell) => void, failed: (reason: string) => void) {
    this.#ready = ready;
    this.#failed = failed;
    this.#child = spawn(process.execPath, ["-e", SPAWNER, JSON.stringify(userCgroup)], { stdio: ["ignore", "ignore", "inherit", "ipc"], env: {} });
    this.#child.on("message", (m: Message, handle?: Socket) => this.#receive(m, handle));
    this.#child.once("error", () => this.#gone());
    this.#child.once("exit", () => this.#gone());
    // Neither the process nor its channel may keep the agent running.
    this.#child.unref();
    this.#child.channel?.unref();
  }

  get alive(): boolean {
    return this.#alive;
  }

  /** Asks for one shell; false when the spawner is gone. */
  request(req: ShellRequest): boolean {
    if (!this.#alive || !this.#child.connected) return false;
    this.#child.send(req, (err) => err && this.#gone());
    return true;
  }

  /** Ends the spawner and every shell it started. */
  stop(): void {
    this.#child.kill("SIGKILL");
    this.#gone();
  }

  #receive(m: Message, handle?: Socket): void {
    if ("joined" in m) {
      this.joined = m.joined;
      return;
    }
    if ("failed" in m) return this.#failed(m.failed);
    let shell = this.#shells.get(m.pid);
    if (!shell) this.#shells.set(m.pid, (shell = new SpawnedShell(m.pid)));
    if ("fd" in m) {
      if (!handle) return;
      handle.unref();
      if (m.fd === 1) shell.stdout = handle;
      else if (m.fd === 2) shell.stderr = handle;
      else shell.input = handle;
      if (shell.complete && !shell.exited) this.#ready(shell);
      return;
    }
    this.#shells.delete(m.pid);
    shell.exit(m.code, m.signal);
  }

  /**
   * The spawner exited (killed, or its channel broke): no exit can be reported any more, so every
   * shell it started is ended and reported killed.
   */
  #gone(): void {
    if (!this.#alive) return;
    this.#alive = false;
    for (const shell of this.#shells.values()) {
      try {
        process.kill(-shell.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
      shell.exit(null, "SIGKILL");
    }
    this.#shells.clear();
  }
}
