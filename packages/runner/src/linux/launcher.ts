import { spawn } from "node:child_process";
import { closeSync, openSync, watch, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import path from "node:path";
import type { Writable } from "node:stream";
import { encodeArgs } from "./bwrap.ts";
import { sleep } from "./cgroups/types.ts";
import { accepts, readRestarts } from "../host/agent-socket.ts";
import { spawner } from "../host/spawner.ts";

// Starts a sandbox's first process:  sh (joins the cgroups) -> setpriv (drops to the sandbox's
// host uid, no new privileges) -> bwrap (namespaces) -> the agent.
// The shell joins before anything else runs, so every process of the sandbox is counted and
// limited from its first instruction. setpriv instead of bwrap's own --uid because bwrap run by
// real root maps the sandbox user to host root (see research/isolation-probe.md, §2).
// The child is detached: sandboxes outlive a runner restart and are found again via their cgroup.

const JOIN = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"';

export interface LaunchOptions {
  bwrap: string;
  setpriv: string;
  hostUid: number;
  hostGid: number;
  procsFiles: string[];
  /** bwrap options, passed over a pipe. */
  bwrapOptions: string[];
  /** The sandbox's first process. */
  command: string[];
  /** stdout and stderr of the sandbox's first process. */
  logFile: string;
  /** A compiled seccomp program (see syscall-filter.ts), installed by bwrap for every sandbox process. */
  seccompFile?: string;
  /** Supplementary groups of every sandbox process (the volume group); none by default. */
  groups?: number[];
  /** File creation mask of the first process (inherited by all); 002 lets volume users share files. */
  umask?: number;
  /** Network namespace (its /run/netns path) entered, still as root, before dropping to the sandbox uid. */
  netns?: { nsenter: string; path: string };
  /**
   * oom_score_adj of the first process, set by the host before the sandbox exists (see below), so
   * every process of it starts with this score. -1000 for the agent's leaf: see protectFromOom.
   */
  oomScoreAdj?: number;
}

/**
 * The launched chain's first process (what the provider uses of it: its pid and "exit" events);
 * `oomScoreDenied`: the host may not set the asked oom_score_adj.
 */
export interface LaunchedProcess {
  readonly pid?: number | undefined;
  readonly exitCode: number | null;
  readonly signalCode: NodeJS.Signals | null;
  readonly oomScoreDenied: boolean;
  on(event: "exit", listener: ExitListener): unknown;
  once(event: "exit", listener: ExitListener): unknown;
  off(event: "exit", listener: ExitListener): unknown;
}
type ExitListener = (code: number | null, signal: NodeJS.Signals | null) => void;

/** Starts the chain: from the runner's spawner process when it runs (spawner.ts), else from here. */
export async function launch(o: LaunchOptions): Promise<LaunchedProcess> {
  const args = [
    "-c", o.umask === undefined ? JOIN : `umask ${o.umask.toString(8).padStart(3, "0")}; ${JOIN}`, "sandbar-launch", ...o.procsFiles, "--",
    ...(o.netns ? [o.netns.nsenter, `--net=${o.netns.path}`, "--"] : []),
    o.setpriv, `--reuid=${o.hostUid}`, `--regid=${o.hostGid}`, ...(o.groups?.length ? [`--groups=${o.groups.join(",")}`] : ["--clear-groups"]), "--no-new-privs",
    o.bwrap, "--args", "3", "--", ...o.command,
  ];
  const options = encodeArgs(o.seccompFile === undefined ? o.bwrapOptions : [...o.bwrapOptions, "--seccomp", "4"]);
  const helper = spawner();
  if (helper) return helper.launch({ cmd: "/bin/sh", args, logFile: o.logFile, seccompFile: o.seccompFile, pipe3: options, oomScoreAdj: o.oomScoreAdj });
  return launchHere(args, options, o);
}

function launchHere(args: string[], bwrapOptions: Buffer, o: LaunchOptions): LaunchedProcess {
  const log = openSync(o.logFile, "w", 0o600);
  // fd 4 of bwrap: it reads the filter from there (an inherited descriptor survives sh and setpriv).
  const filter = o.seccompFile ? openSync(o.seccompFile, "r") : undefined;
  try {
    const child = spawn("/bin/sh", args, { stdio: ["ignore", log, log, "pipe", filter ?? "ignore"], detached: true, env: {} });
    // The score goes on the launcher (still sh, or setpriv, or bwrap by now: one pid throughout)
    // before bwrap gets its options, which it reads before it forks anything: the init and the
    // agent inherit it from their first instruction, and no pid list is read after the start.
    const oomScoreDenied = o.oomScoreAdj !== undefined && child.pid !== undefined && !setOomScoreAdj(child.pid, o.oomScoreAdj);
    const argsPipe = child.stdio[3] as Writable;
    argsPipe.on("error", () => undefined); // bwrap died before reading: reported via exit
    argsPipe.end(bwrapOptions);
    child.unref();
    return Object.assign(child, { oomScoreDenied });
  } finally {
    closeSync(log);
    if (filter !== undefined) closeSync(filter);
  }
}

/**
 * Resolves once `socket` accepts a connection; rejects if the child exits first, if the agent
 * died once already (its supervisor wrote `restartsFile`, in the socket's directory), or time
 * runs out.
 * Waits on inotify for the socket to appear (no busy polling while node boots, which matters when
 * several sandboxes start at once), then retries the connect briefly for the bind-to-listen gap.
 */
export async function waitForSocket(socket: string, child: LaunchedProcess, timeoutMs: number, logFile: string, restartsFile?: string): Promise<void> {
  let exited: string | undefined;
  let wake = () => undefined as void;
  let pending = false;
  const poke = () => {
    pending = true;
    wake();
  };
  const onExit = (code: number | null, signal: string | null) => {
    exited = signal ? `was killed by ${signal}` : `exited with ${code}`;
    poke();
  };
  child.once("exit", onExit);
  if (child.exitCode !== null || child.signalCode !== null) onExit(child.exitCode, child.signalCode);
  const watcher = watch(path.dirname(socket), poke);
  watcher.on("error", () => undefined); // the fallback tick still runs
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      if (exited) throw new Error(`the sandbox's first process ${exited} before listening on its socket${await logTail(logFile)}`);
      const died = restartsFile ? await readRestarts(restartsFile) : undefined;
      if (died && died.count > 0) {
        throw new Error(`the agent exited with ${died.lastStatus ?? "?"} before listening on its socket${await logTail(logFile)}`);
      }
      pending = false;
      const state = await accepts(socket);
      if (state === "accepting") return;
      if (Date.now() > deadline) {
        throw new Error(`the sandbox's first process did not listen on ${socket} within ${timeoutMs} ms${await logTail(logFile)}`);
      }
      if (state === "refused") {
        await sleep(1); // bound, not yet listening
        continue;
      }
      if (pending) continue;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 100);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  } finally {
    watcher.close();
    child.off("exit", onExit);
  }
}

/**
 * oom_score_adj of the agent leaf's processes (the outer bwrap, the init, the agent): the kernel
 * never picks them. Only the host can set it (lowering needs CAP_SYS_RESOURCE, which some hosts'
 * root lacks: then the agent keeps 0 while user processes raise theirs to +1000, which still makes
 * any user process the OOM killer's choice before the agent). Set on the launcher (launch's
 * `oomScoreAdj`) and inherited, which is why the agent raises its user processes' score again.
 */
export const AGENT_OOM_SCORE_ADJ = -1000;

/**
 * Synchronous (see launch). False where the host may not (lowering needs CAP_SYS_RESOURCE); a
 * process already gone counts as done: its exit is what the start reports.
 */
function setOomScoreAdj(pid: number, score: number): boolean {
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, String(score));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EACCES" || code === "EPERM") return false;
    if (code !== "ENOENT" && code !== "ESRCH") throw err;
  }
  return true;
}

/** The end of the first process's output, for error messages (reads only the last `bytes`). */
async function logTail(file: string, bytes = 2000): Promise<string> {
  try {
    const fh = await open(file, "r");
    try {
      const size = (await fh.stat()).size;
      const buf = Buffer.alloc(Math.min(size, bytes));
      await fh.read(buf, 0, buf.length, size - buf.length);
      const t = buf.toString().trim();
      return t ? `; its output:\n${t}` : "";
    } finally {
      await fh.close();
    }
  } catch {
    return "";
  }
}
