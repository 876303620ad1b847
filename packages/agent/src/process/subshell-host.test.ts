import { execFile } from "node:child_process";
import { closeSync, constants, existsSync, openSync, readFileSync, writeSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { SLOTS, START_TIMEOUT_MS, SubshellHost, type Subshell } from "./subshell-host.ts";

const run = promisify(execFile);

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-subshell-host-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const host = (prelude = "", sequential = false) => new SubshellHost({ shell: "/bin/bash", cwd: dir, env: { PATH: process.env.PATH, HOME: dir }, prelude, sequential });
const sequential = () => host("", true);

/** Output and exit of one subshell. */
function finished(shell: Subshell): Promise<{ output: string; code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => {
    let output = "";
    let exit: [number | null, NodeJS.Signals | null] | undefined;
    let closed = false;
    const done = () => exit && closed && resolve({ output, code: exit[0], signal: exit[1] });
    shell.stdout.on("data", (d: Buffer) => (output += d));
    shell.stdout.once("close", () => ((closed = true), done()));
    shell.once("exit", (code: number | null, signal: NodeJS.Signals | null) => ((exit = [code, signal]), done()));
  });
}

it("runs one script per slot, in its own process group, stdout and stderr in one output, then exits", async () => {
  const h = host();
  const runs: Promise<{ output: string; code: number | null }>[] = [];
  for (let i = 0; i < SLOTS; i++) {
    const shell = (await h.run(`echo out-${i}; echo err-${i} >&2; [ "$(ps -o pgid= -p $BASHPID | tr -d ' ')" != "$(ps -o pgid= -p ${process.pid} | tr -d ' ')" ] && exit ${i}`))!;
    expect(shell.pid).toBeGreaterThan(0);
    runs.push(finished(shell));
  }
  for (const [i, r] of (await Promise.all(runs)).entries()) expect(r).toEqual({ output: `out-${i}\nerr-${i}\n`, code: i, signal: null });
  expect(h.free).toBe(0);
  expect(await h.run("true")).toBeUndefined();
});

it("ends a host that does not fork a job in time: the script reports nothing ran, and never runs later", async () => {
  const marker = path.join(dir, "ran");
  const held = path.join(dir, "host-held");
  // A host stuck before its loop (as one retrying a refused fork is) until this test lets it go.
  const h = host(`while [ ! -e ${held} ]; do sleep 0.05; done; `);
  const pid = h.pid!;
  // Answered while the host is still stuck: it was ended, not waited for.
  expect(await h.run(`echo ran > ${marker}`)).toBeUndefined();
  expect(h.free).toBe(0);
  // Let it go: a host still alive would now run the script; an ended one is gone.
  await writeFile(held, "");
  await eventually("the ended host to be gone", () => !existsSync(`/proc/${pid}`));
  await expect(readFile(marker, "utf8")).rejects.toMatchObject({ code: "ENOENT" });
});

it("reports a job killed before its script's end as SIGKILL, and one killed by its script's signal by its status", async () => {
  const h = host();
  const killedJob = (await h.run("me=$BASHPID; kill -9 $(awk '{print $4}' /proc/$me/stat); sleep 0.5"))!;
  expect(await finished(killedJob)).toMatchObject({ code: null, signal: "SIGKILL" });
  const killedSelf = (await h.run("kill -TERM $BASHPID"))!;
  expect(await finished(killedSelf)).toMatchObject({ code: 143, signal: null });
  h.stop();
});

it("keeps running what it started when the host is stopped", async () => {
  const h = host();
  const shell = (await h.run("sleep 0.3; echo after"))!;
  h.stop();
  expect(await finished(shell)).toEqual({ output: "after\n", code: 0, signal: null });
});

describe("a sequential host", () => {
  it("runs one script at a time as its own child (one fork), in its own process group, with its status; busy until then", async () => {
    const h = sequential();
    const hostPid = h.pid;
    for (let i = 0; i < SLOTS; i++) {
      // The script holds until the test has seen the host busy (a loaded machine may run it to its end first).
      const gate = path.join(dir, `sequential-gate-${i}`);
      const shell = (await h.run(`me=$BASHPID; echo out-$(awk '{print $4}' /proc/$me/stat); echo err-${i} >&2; while [ ! -e ${gate} ]; do sleep 0.01; done; [ "$(ps -o pgid= -p $BASHPID | tr -d ' ')" = $BASHPID ] && exit ${i}`))!;
      expect(h.busy).toBe(true);
      expect(await h.run("true")).toBeUndefined();
      await writeFile(gate, "");
      expect(await finished(shell)).toEqual({ output: `out-${hostPid}\nerr-${i}\n`, code: i, signal: null });
      expect(h.busy).toBe(false);
    }
    expect(h.free).toBe(0);
    expect(await h.run("true")).toBeUndefined();
  });

  it("reports 128+n for a script killed by a signal, a program's status after exec, and waits out a stopped script", async () => {
    const h = sequential();
    expect(await finished((await h.run("kill -TERM $BASHPID"))!)).toMatchObject({ code: 143, signal: null });
    expect(await finished((await h.run("exec sh -c 'exit 7'"))!)).toMatchObject({ code: 7, signal: null });
    // "resumed" is echoed only after the CONT: the status was not taken from the stop.
    const stopped = (await h.run("me=$BASHPID; (sleep 0.4; kill -CONT $me) & kill -STOP $me; echo resumed; exit 5"))!;
    expect(await finished(stopped)).toEqual({ output: "resumed\n", code: 5, signal: null });
    h.stop();
  });

  it("reports a script whose host user code killed as SIGKILL, once it has ended, with all its output", async () => {
    const h = sequential();
    // "gone-on" is echoed after the host died: the report waited for the script's end.
    const orphan = (await h.run("me=$BASHPID; kill -9 $(awk '{print $4}' /proc/$me/stat); sleep 0.4; echo gone-on"))!;
    expect(await finished(orphan)).toEqual({ output: "gone-on\n", code: null, signal: "SIGKILL" });
    expect(await h.run("true")).toBeUndefined();
  });

  it("lets a retired host finish its script and report its status; it takes nothing new", async () => {
    const h = sequential();
    const shell = (await h.run("sleep 0.3; echo after; exit 4"))!;
    h.retire();
    expect(await finished(shell)).toEqual({ output: "after\n", code: 4, signal: null });
    expect(await h.run("true")).toBeUndefined();
  });
});

/** Until the agent has reaped process pid (node has handled its exit). */
async function reaped(pid: number): Promise<void> {
  await eventually(`process ${pid} to be reaped`, () => !existsSync(`/proc/${pid}`));
}

describe("an execution read only after its host has exited (the agent late to read, as under CPU starvation)", () => {
  // Node flows a child's stdio streams once it exits: an execution's output, still waiting for
  // the reader that "p" brings, went to no listener and the execution answered exit 0, "".
  const late = async (h: SubshellHost, shell: Subshell) => {
    // The status is in (the output was written before it) and node has handled the host's exit.
    const code = await new Promise((r) => shell.once("exit", r));
    await reaped(h.pid!);
    let output = "";
    if (shell.stdout.destroyed) return { output, code };
    shell.stdout.on("data", (d: Buffer) => (output += d));
    await new Promise((r) => shell.stdout.once("close", r));
    return { output, code };
  };

  it("keeps the output of a job whose host ended after its last slot", async () => {
    const h = host();
    for (let i = 0; i < SLOTS - 1; i++) expect(await finished((await h.run("true"))!)).toMatchObject({ code: 0 });
    const last = (await h.run("echo s-k-$((6*7))"))!;
    expect(await late(h, last)).toEqual({ output: "s-k-42\n", code: 0 });
  });

  it("keeps the output of a sequential host's last execution", async () => {
    const h = sequential();
    for (let i = 0; i < SLOTS - 1; i++) expect(await finished((await h.run("true"))!)).toMatchObject({ code: 0 });
    const last = (await h.run("echo s-k-$((6*7))"))!;
    expect(await late(h, last)).toEqual({ output: "s-k-42\n", code: 0 });
  });

  it("keeps the output of a job whose host was stopped", async () => {
    const h = host();
    const shell = (await h.run("echo s-k-$((6*7))"))!;
    h.stop();
    expect(await late(h, shell)).toEqual({ output: "s-k-42\n", code: 0 });
  });
});

describe("a sequential host judged stalled (no pid line within START_TIMEOUT_MS)", () => {
  /** Blocks this process's event loop (an agent starved of CPU) until `until` holds and `ms` have passed. */
  const starve = (ms: number, until: () => boolean = () => true) => {
    const end = Date.now() + ms;
    const tick = new Int32Array(new SharedArrayBuffer(4));
    while (Date.now() < end || !until()) {
      if (Date.now() > end + 10_000) throw new Error("starve: the condition never held");
      Atomics.wait(tick, 0, 0, 5);
    }
  };
  /** Whether a child of the host waits at a gate (blocked opening its FIFO). */
  const atGate = (host: number) =>
    readFileSync(`/proc/${host}/task/${host}/children`, "utf8").trim().split(" ").filter(Boolean).some((pid) => {
      try {
        return readFileSync(`/proc/${pid}/wchan`, "utf8") === "wait_for_partner";
      } catch {
        return false;
      }
    });
  /** A FIFO a script waits at (`read -r _ < gate`) until opened; opened read-write, so never blocking this side. */
  const gates: number[] = [];
  const gate = async (name: string) => {
    const file = path.join(dir, name);
    await run("mkfifo", [file]);
    const open = () => {
      const fd = openSync(file, constants.O_RDWR);
      gates.push(fd);
      writeSync(fd, "go\n");
    };
    return { file, open };
  };
  afterAll(() => gates.forEach((fd) => closeSync(fd)));

  it("stalling after its fork and before the report: the script runs once, reported as running", async () => {
    const marker = path.join(dir, "once");
    // The host stops itself where it used to write the subshell's pid (a starved host): it was
    // then ended and the script run again by the launcher while the subshell (its own process
    // group) ran it too.
    const h = host(`__host=$BASHPID; echo() { [ "$1" = p ] && [ "$BASHPID" = "$__host" ] && kill -STOP $BASHPID; builtin echo "$@"; }; `, true);
    const shell = await h.run(`echo ran >> ${marker}; echo done`);
    expect(shell, "the script ran: it must not be reported as not run").toBeDefined();
    expect(await finished(shell!)).toEqual({ output: "done\n", code: 0, signal: null });
    expect(await readFile(marker, "utf8")).toBe("ran\n");
    h.stop();
  });

  it("on an agent starved past the limit, the pid line already in the pipe is read before the host is judged", async () => {
    const g = await gate("gate-1");
    const h = sequential();
    const pending = h.run(`read -r _ < ${g.file}; echo s-k-$((6*7))`);
    // The subshell has reported and waits at the gate; the agent wakes after the limit.
    starve(START_TIMEOUT_MS + 100, () => atGate(h.pid!));
    const shell = (await pending)!;
    expect(shell).toBeDefined();
    const result = finished(shell);
    g.open();
    expect(await result).toEqual({ output: "s-k-42\n", code: 0, signal: null });
    h.stop();
  });

  it("whose subshell is forked but slow to report is not ended: the execution keeps its status", async () => {
    const reported = await gate("gate-2");
    const ends = await gate("gate-3");
    // The subshell (not the host) waits at a gate before it reports, as a starved one would.
    const h = host(`__host=$BASHPID; echo() { [ "$1" = p ] && [ "$BASHPID" != "$__host" ] && read -r _ < ${reported.file}; builtin echo "$@"; }; `, true);
    const pending = h.run(`read -r _ < ${ends.file}; echo s-k-$((6*7))`);
    starve(START_TIMEOUT_MS + 100, () => atGate(h.pid!));
    // Opened once the stall has been judged (a timer after the stall's, in the same phase).
    setTimeout(() => (reported.open(), ends.open()), 0);
    const shell = await pending;
    expect(shell).toBeDefined();
    expect(await finished(shell!)).toEqual({ output: "s-k-42\n", code: 0, signal: null });
    h.stop();
  });
});
