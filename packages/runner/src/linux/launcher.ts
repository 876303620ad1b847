import type { ChildProcess } from "node:child_process";
import { spawn } from "node:child_process";
import { closeSync, openSync, watch } from "node:fs";
import { open, stat } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import type { Writable } from "node:stream";
import { encodeArgs } from "./bwrap.ts";
import { sleep } from "./cgroups/types.ts";

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
}

export function launch(o: LaunchOptions): ChildProcess {
  const log = openSync(o.logFile, "w", 0o600);
  try {
    const child = spawn(
      "/bin/sh",
      [
        "-c", JOIN, "sandbar-launch", ...o.procsFiles, "--",
        o.setpriv, `--reuid=${o.hostUid}`, `--regid=${o.hostGid}`, "--clear-groups", "--no-new-privs",
        o.bwrap, "--args", "3", "--", ...o.command,
      ],
      { stdio: ["ignore", log, log, "pipe"], detached: true, env: {} },
    );
    const argsPipe = child.stdio[3] as Writable;
    argsPipe.on("error", () => undefined); // bwrap died before reading: reported via exit
    argsPipe.end(encodeArgs(o.bwrapOptions));
    child.unref();
    return child;
  } finally {
    closeSync(log);
  }
}

/**
 * Resolves once `socket` accepts a connection; rejects if the child exits first or time runs out.
 * Waits on inotify for the socket to appear (no busy polling while node boots, which matters when
 * several sandboxes start at once), then retries the connect briefly for the bind-to-listen gap.
 */
export async function waitForSocket(socket: string, child: ChildProcess, timeoutMs: number, logFile: string): Promise<void> {
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

async function accepts(socket: string): Promise<"absent" | "refused" | "accepting"> {
  try {
    if (!(await stat(socket)).isSocket()) return "absent";
  } catch {
    return "absent";
  }
  return new Promise((resolve) => {
    const s = net.connect(socket);
    s.once("connect", () => {
      s.destroy();
      resolve("accepting");
    });
    s.once("error", () => resolve("refused"));
  });
}

/** The end of the first process's output, for error messages (reads only the last `bytes`). */
export async function logTail(file: string, bytes = 2000): Promise<string> {
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
