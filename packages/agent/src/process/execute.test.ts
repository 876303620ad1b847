import { execFile, spawn } from "node:child_process";
import { closeSync, constants, openSync, readFileSync, readdirSync, writeSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import type { AgentContext } from "../context.ts";
import { DRAIN_MS, execute } from "./execute.ts";
import { ShellLauncher } from "./launcher.ts";

// execute() in this process, which plays the agent: its event loop is blocked where a starved
// agent's would not run.

let dir: string;
let ctx: AgentContext;
const shutdown = new AbortController();
beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-execute-"));
  ctx = {
    workDir: dir,
    homeDir: dir,
    stateDir: dir,
    env: { PATH: process.env.PATH, HOME: dir },
    envGeneration: 0,
    envChanges: new EventTarget(),
    shell: "/bin/bash",
    version: "test",
    sandboxed: false,
    shutdown: shutdown.signal,
    log: () => undefined,
  };
});
afterAll(async () => {
  shutdown.abort();
  await rm(dir, { recursive: true, force: true });
});

/** Blocks the event loop (an agent starved of CPU) until `until` holds and at least `ms` have passed. */
function starve(ms: number, until: () => boolean = () => true): void {
  const end = Date.now() + ms;
  const tick = new Int32Array(new SharedArrayBuffer(4));
  while (Date.now() < end || !until()) {
    if (Date.now() > end + 10_000) throw new Error("starve: the condition never held");
    Atomics.wait(tick, 0, 0, 2);
  }
}

function state(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat[stat.lastIndexOf(")") + 2];
  } catch {
    return undefined;
  }
}

/** This process's child whose command line mentions `text`. */
function childWith(text: string): number | undefined {
  for (const task of readdirSync(`/proc/${process.pid}/task`)) {
    for (const pid of readFileSync(`/proc/${process.pid}/task/${task}/children`, "utf8").trim().split(" ").filter(Boolean)) {
      try {
        if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(text)) return Number(pid);
      } catch {
        // Gone meanwhile.
      }
    }
  }
  return undefined;
}

it("keeps the output of a shell reaped with another's SIGCHLD before its output was read, on an agent starved past the drain grace", async () => {
  // The first execution runs in a shell of its own (no host yet). It waits at a gate.
  const gate = path.join(dir, "gate");
  await promisify(execFile)("mkfifo", [gate]);
  const pending = execute(ctx, new ShellLauncher(ctx), { command: `read -r _ < ${gate}; echo s-k-$((6*7))`, envs: {} });
  let shell: number | undefined;
  await eventually("the shell to wait at the gate", () => (shell = childWith(gate)) !== undefined && readFileSync(`/proc/${shell}/wchan`, "utf8") === "wait_for_partner");

  // Another child's output and SIGCHLD in one poll phase (signals are handled last in it): while
  // its output is handled, the execution's shell writes and exits, so the SIGCHLD handling reaps
  // it too, its output not read yet; then the agent is starved past DRAIN_MS before its next turn.
  const other = spawn("/bin/sh", ["-c", "echo other"], { stdio: ["ignore", "pipe", "ignore"] });
  let fd: number | undefined;
  other.stdout.once("data", () => {
    fd = openSync(gate, constants.O_RDWR);
    writeSync(fd, "go\n");
    while (state(shell!) !== "Z") Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    setImmediate(() => starve(DRAIN_MS + 50));
  });
  starve(0, () => state(other.pid!) === "Z");
  try {
    expect(await pending).toEqual({ exitCode: 0, result: "s-k-42\n" });
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
});
