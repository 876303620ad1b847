import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { INIT_SCRIPT, initArgs } from "./init-script.ts";

// The supervising init on its own (not as a namespace's pid 1): restarts with backoff, the
// restarts file, SIGTERM forwarding and its exit status. A stand-in "agent" counts its runs.

let dir: string | undefined;
afterEach(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});


it("restarts a dying agent (0.1 s, then 0.5 s), counts it, and forwards SIGTERM to the one that stays", async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-init-"));
  const runs = path.join(dir, "runs");
  const restarts = path.join(dir, "restarts");
  // Dies with 7 on its first two runs; the third traps TERM (and says when it has), says so and exits 0.
  const agent = `echo "run $SANDBAR_AGENT_RESTARTS" >> ${runs}; [ "$(wc -l < ${runs})" -ge 3 ] || exit 7; trap 'echo term >> ${runs}; exit 0' TERM; echo trapped >> ${runs}; while :; do sleep 0.05; done`;
  const t0 = Date.now();
  const init = spawn("/bin/sh", ["-c", INIT_SCRIPT, ...initArgs(restarts), "/bin/sh", "-c", agent], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  init.stderr.on("data", (c: Buffer) => (log += c.toString()));
  const exited = new Promise<number | null>((r) => init.once("exit", (code) => r(code)));
  await eventually("the third run to trap TERM", async () => (await readFile(runs, "utf8").catch(() => "")).includes("trapped"));
  expect(Date.now() - t0).toBeGreaterThanOrEqual(550); // 0.1 s + 0.5 s of backoff
  expect(await readFile(runs, "utf8")).toBe("run 0\nrun 1\nrun 2\ntrapped\n");
  expect((await readFile(restarts, "utf8")).trim()).toBe("2 7");
  expect(log).toContain("sandbar-init: the agent exited with 7; restart 1 in 0.1s");
  expect(log).toContain("restart 2 in 0.5s");
  init.kill("SIGTERM");
  expect(await exited).toBe(0); // the agent's status, once it has exited
  expect(await readFile(runs, "utf8")).toBe("run 0\nrun 1\nrun 2\ntrapped\nterm\n");
});

it("exits at once on SIGTERM while it waits to restart the agent", async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-init-"));
  const restarts = path.join(dir, "restarts");
  // Quick deaths: the third restart waits 1 s, the fourth 2 s.
  const init = spawn("/bin/sh", ["-c", INIT_SCRIPT, ...initArgs(restarts), "/bin/sh", "-c", "exit 5"], { stdio: "ignore" });
  const exited = new Promise<number | null>((r) => init.once("exit", (code) => r(code)));
  await eventually("the third restart", async () => (await readFile(restarts, "utf8").catch(() => "")).startsWith("3 "));
  init.kill("SIGTERM");
  expect(await exited).toBe(5);
  // Ended during the wait, not after it: no fourth restart was made.
  expect((await readFile(restarts, "utf8")).startsWith("3 ")).toBe(true);
});

it("gives up after the most quick deaths in a row, exiting with the agent's status", async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-init-"));
  const restarts = path.join(dir, "restarts");
  const init = spawn("/bin/sh", ["-c", INIT_SCRIPT, ...initArgs(restarts, [0.01, 0.02], 3), "/bin/sh", "-c", "exit 6"], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  init.stderr.on("data", (c: Buffer) => (log += c.toString()));
  expect(await new Promise<number | null>((r) => init.once("exit", (code) => r(code)))).toBe(6);
  expect((await readFile(restarts, "utf8")).trim()).toBe("4 6");
  expect(log).toContain("restart 1 in 0.01s");
  expect(log).toContain("restart 3 in 0.02s"); // the last delay repeats
  expect(log).toContain("the agent died 4 times in a row (last status 6); giving up");
});
