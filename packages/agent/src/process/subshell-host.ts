/**
 * A resident bash that runs each execution in a subshell it forks: a fork of a small bash is
 * about 0.3 ms, where a new bash (fork, exec, dynamic linking, start-up) is about 1.5 ms of CPU
 * plus the work of whoever starts it, on the critical path or competing with it on two cores.
 *
 * A subshell needs its own output pipe and a way to report its exit, but bash cannot receive
 * descriptors. So the agent starts the host with every pipe it will ever use: `SLOTS` slots, each
 * an output pipe (stdout and stderr together, as executions answer them) and a status pipe. The
 * agent writes NUL-terminated scripts to the host's fd 3, slot after slot; for each, the host
 * forks a job (its own process group, `set -m`) that reports its pid on the slot's status pipe,
 * runs the script in a subshell with the slot's output as stdout and stderr, and reports its exit
 * status. The host then closes its copies of the slot's pipes (and every job closes the slots
 * after its own), so an output ends when the execution and what it left running end. A host
 * whose slots are used up exits; the launcher starts the next one ahead of need.
 *
 * On the status pipe: "p <pid>" then "s <status>", then end of file. End of file without "p":
 * the host died (or was ended, see START_TIMEOUT_MS) before the job was forked, nothing ran (the
 * launcher runs the script elsewhere).
 * Without "s": the job was killed (reported as SIGKILL, as a killed shell would be).
 *
 * A sequential host (`sequential`, see sequentialScript) forks the subshell itself and waits for
 * it: one fork per execution instead of two, one execution at a time (`busy` until its status is
 * in). The subshell writes its own "p" before anything else (a host ended between its fork and a
 * "p" of its own left a subshell running the script while the launcher ran it again). Without
 * "s" the host died while the subshell ran (killed by user code): the subshell may go on, and is
 * reported as SIGKILL once it is gone.
 *
 * What a subshell cannot give: `$$` and `$PPID` are the host's. The launcher sends scripts that
 * mention them to a shell of their own.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import type { Socket } from "node:net";
import type { Readable, Writable } from "node:stream";
import { shellQuote } from "../util/shell.ts";

/** Executions one host runs before it exits; each costs the agent two descriptors until then. */
export const SLOTS = 16;
/**
 * A host that has not forked an execution's job by then is ended. bash retries a refused fork
 * for about 15 s (a fork storm filling the user's pids): the execution goes to a shell of the
 * agent's own instead, which the agent's reserve can still start. Not a sequential host that has
 * forked (its subshell, starved of CPU, has not reported yet): see run().
 */
export const START_TIMEOUT_MS = 1000;

/** How often a process whose status died with its parent is looked for, until it is gone. */
const ORPHAN_POLL_MS = 20;

/** Calls gone once process pid has ended (no longer exists, or is a zombie). */
function untilGone(pid: number, gone: () => void): void {
  let state: string | undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    state = stat[stat.lastIndexOf(")") + 2];
  } catch {
    state = undefined;
  }
  if (state === undefined || state === "Z" || state === "X") gone();
  else setTimeout(() => untilGone(pid, gone), ORPHAN_POLL_MS);
}

const out = (slot: number) => 4 + 2 * slot;
const status = (slot: number) => 5 + 2 * slot;

/** Redirections closing the pipes of the slots after `slot` (a job must not hold them open). */
function laterSlots(slot: number): string {
  const parts: string[] = [];
  for (let s = slot + 1; s < SLOTS; s++) parts.push(`${out(s)}>&-`, `${status(s)}>&-`);
  return parts.join(" ");
}

/** Redirections a sequential host's subshell starts with: only its own output is left open. */
function sequentialClosers(slot: number): string {
  return `3<&- ${status(slot)}>&- ${laterSlots(slot)}`.trim();
}

/**
 * A host's read loop around `body`: each NUL-terminated request in `__sandbar_script`, its slot's
 * output and status descriptors in `__sandbar_o` and `__sandbar_t`, and `__sandbar_close[slot]`
 * the redirections (from `closers`) its subshell starts with. `prelude` runs first (joining the
 * user cgroup, its OOM score). The host exits after its last slot.
 */
function hostLoop(prelude: string, closers: (slot: number) => string, body: string): string {
  const close = Array.from({ length: SLOTS }, (_, s) => shellQuote(closers(s))).join(" ");
  return `${prelude}set -m
__sandbar_close=(${close})
__sandbar_slot=0
while IFS= read -r -d '' __sandbar_script <&3; do
  __sandbar_o=$((4 + 2 * __sandbar_slot)); __sandbar_t=$((5 + 2 * __sandbar_slot))
${body}
  __sandbar_slot=$((__sandbar_slot + 1))
  [ "$__sandbar_slot" -lt ${SLOTS} ] || exit 0
done
`;
}

/**
 * A sequential host's program: one subshell at a time, forked by the host itself, which waits
 * for it (one fork per execution where a job-running host takes two). bash cannot wait for a
 * child and read its next request at once (a CHLD trap is deferred while `read` blocks, and a
 * `wait` interrupted by a trapped signal can lose a child's status: both tried on bash 5.2), so
 * the agent sends such a host a request only when it has reported the previous one's status.
 * It waits without job control (`set +m`), which would end the wait when the subshell is
 * merely stopped; job control is back on for the next fork (its own process group).
 */
function sequentialScript(prelude: string): string {
  return hostLoop(prelude, sequentialClosers, `  eval "( echo p \\$BASHPID >&$__sandbar_t; exec \${__sandbar_close[__sandbar_slot]} 1>&$__sandbar_o 2>&1 $__sandbar_o>&-; set +m; unset __sandbar_close __sandbar_slot __sandbar_o __sandbar_t; eval \\"\\$__sandbar_script\\" ) &"
  exec {__sandbar_o}>&-
  set +m
  wait $!
  echo s $? >&$__sandbar_t
  set -m
  exec {__sandbar_t}>&-`);
}

/**
 * A job-running host's program: each request runs in a job (its own process group) that reports
 * its pid, runs the script in a subshell and reports its status, so the host reads on at once.
 * The job's subshell drops the host's variables but keeps `__sandbar_script`, like the warm
 * shells before.
 */
function hostScript(prelude: string): string {
  return hostLoop(prelude, laterSlots, `  eval "{ exec 3<&- \${__sandbar_close[__sandbar_slot]}; echo p \\$BASHPID >&$__sandbar_t; ( exec $__sandbar_t>&- 1>&$__sandbar_o 2>&1 $__sandbar_o>&-; set +m; unset __sandbar_close __sandbar_slot __sandbar_o __sandbar_t; eval \\"\\$__sandbar_script\\" ); echo s \\$? >&$__sandbar_t; } &"
  eval "exec $__sandbar_o>&- $__sandbar_t>&-"`);
}

/** One execution in a host's subshell, with the events of a ChildProcess that execute() reads. */
export class Subshell extends EventEmitter {
  pid: number | undefined;
  readonly stdout: Readable;
  readonly stderr = null;

  constructor(output: Readable) {
    super();
    this.stdout = output;
  }
}

export interface HostOptions {
  shell: string;
  cwd: string;
  /** The environment the host (and every subshell) starts with; copied. */
  env: NodeJS.ProcessEnv;
  /** Shell code the host runs first. */
  prelude: string;
  /** One execution at a time, one fork each (see sequentialScript); run() only when not busy. */
  sequential?: boolean;
}

export class SubshellHost {
  readonly #child: ChildProcess;
  readonly #requests: Writable;
  /** The host's descriptors by number (the slots' from 4 on), held here and not in #child.stdio. */
  readonly #pipes: Socket[];
  #next = 0;
  #alive = true;
  #stalled = false;
  /** Executions started whose status is not in yet. */
  #running = 0;
  readonly sequential: boolean;
  /** The variables the host was started with: an execution exports what changed since. */
  readonly env: Readonly<NodeJS.ProcessEnv>;

  constructor(options: HostOptions) {
    this.env = { ...options.env };
    this.sequential = options.sequential ?? false;
    const stdio: ("ignore" | "pipe")[] = ["ignore", "ignore", "ignore", "pipe"];
    for (let s = 0; s < SLOTS; s++) stdio.push("pipe", "pipe");
    this.#child = spawn(options.shell, ["-c", this.sequential ? sequentialScript(options.prelude) : hostScript(options.prelude)], { cwd: options.cwd, env: this.env, detached: true, stdio });
    this.#requests = this.#child.stdio[3] as Writable;
    // The slots' pipes are the executions', not the host's: node flows a child's readable stdio
    // streams once it exits (so unread output does not pile up), and the output of an execution
    // whose reader was not attached yet (it comes with the "p" line, read after the host's exit
    // on a starved agent) went to no listener: answered exit 0 with no output.
    const held: (Readable | Writable | null | undefined)[] = this.#child.stdio;
    this.#pipes = held.slice() as Socket[];
    for (let fd = 4; fd < held.length; fd++) held[fd] = null;
    this.#requests.on("error", () => this.#gone());
    this.#child.once("error", () => this.#gone());
    this.#child.once("exit", () => this.#gone());
    // Neither the host nor an unused pipe may keep the agent running.
    this.#child.unref();
    for (let s = 3; s < this.#pipes.length; s++) this.#pipes[s].unref();
  }

  /** The host was ended because it could not fork an execution in time (the user's pids are full). */
  get stalled(): boolean {
    return this.#stalled;
  }

  /** The host bash's pid. */
  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** An execution of a sequential host is still running (it takes no other until it ends). */
  get busy(): boolean {
    return this.sequential && this.#running > 0;
  }

  /** Slots left; 0 once the host is gone. */
  get free(): number {
    return this.#alive ? SLOTS - this.#next : 0;
  }

  /**
   * Runs script in the next slot: the subshell once it has started, or undefined when the host
   * was gone before it could (nothing ran).
   */
  run(script: string): Promise<Subshell | undefined> {
    if (this.free === 0 || this.busy) return Promise.resolve(undefined);
    const slot = this.#next++;
    this.#running++;
    const output = this.#pipes[out(slot)];
    const report = this.#pipes[status(slot)];
    output.ref();
    report.ref();
    this.#requests.write(`${script}\0`);
    return new Promise((resolve) => {
      // Ending the host decides it: either the job exists and reports its pid, or the status
      // pipe ends without one (nothing ran; the script is run elsewhere, never twice).
      const shell = new Subshell(output);
      let closed = false;
      const judge = () => {
        // Judged after this turn's poll phase (setImmediate runs after it): an agent that was
        // itself starved past the limit reads a "p" already in the pipe before ending its host.
        setImmediate(() => {
          if (shell.pid !== undefined || closed) return;
          // A sequential host with a child has forked this execution's subshell, which reports
          // once it runs (a starved one, not a refused fork); ending the host would lose its status.
          if (this.sequential && this.#forked()) stalled = setTimeout(judge, START_TIMEOUT_MS);
          else {
            this.#stalled = true;
            this.stop();
          }
        });
      };
      let stalled = setTimeout(judge, START_TIMEOUT_MS);
      let text = "";
      let exited = false;
      const exit = (code: number | null, signal: NodeJS.Signals | null) => {
        if (exited) return;
        exited = true;
        this.#running--;
        // After the caller's listeners: the pid and the status can arrive in one read.
        setImmediate(() => shell.emit("exit", code, signal));
      };
      report.setEncoding("latin1");
      report.on("data", (chunk: string) => {
        text += chunk;
        let nl: number;
        while ((nl = text.indexOf("\n")) >= 0) {
          const [kind, value] = text.slice(0, nl).split(" ");
          text = text.slice(nl + 1);
          if (kind === "p" && shell.pid === undefined) {
            clearTimeout(stalled);
            shell.pid = Number(value);
            resolve(shell);
          } else if (kind === "s" && shell.pid !== undefined) exit(Number(value), null);
          // A status without "p": a sequential host's subshell died before it reported, before the
          // script; the pipe's end says nothing ran.
        }
      });
      report.once("close", () => {
        closed = true;
        clearTimeout(stalled);
        if (shell.pid === undefined) {
          this.#running--;
          output.destroy();
          return resolve(undefined);
        }
        // Without a status: its parent (the job, or a sequential host) died and the status with
        // it. The subshell may go on (its host killed by user code): reported killed once gone.
        if (!exited) untilGone(shell.pid, () => exit(null, "SIGKILL"));
      });
      report.on("error", () => undefined);
    });
  }

  /**
   * No more executions: the host exits once it has reported what it runs (a sequential host's
   * subshell is its child, whose status would die with it).
   */
  retire(): void {
    if (!this.#alive) return;
    this.#requests.end();
    this.#gone();
  }

  /** Whether the host has a child process (a sequential host: the subshell it forked). */
  #forked(): boolean {
    const pid = this.#child.pid;
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, "latin1").trim() !== "";
    } catch {
      return false;
    }
  }

  /** Ends the host; executions it started go on (each job is its own process group). */
  stop(): void {
    if (this.#child.pid !== undefined) {
      try {
        process.kill(-this.#child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
    }
    this.#gone();
  }

  #gone(): void {
    if (!this.#alive) return;
    this.#alive = false;
    // The slots no job took: nothing will write them.
    for (let s = this.#next; s < SLOTS; s++) {
      this.#pipes[out(s)].destroy();
      this.#pipes[status(s)].destroy();
    }
  }
}
