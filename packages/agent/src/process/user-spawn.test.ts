import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { promisify } from "node:util";
import { afterEach, expect, it } from "vitest";
import { asUserProcess, setUserCgroup, USER_OOM_SCORE_ADJ, userJoinPrelude } from "./user-spawn.ts";

// The wrapper that puts the agent's children in the sandbox's user cgroup. Outside a sandbox the
// procs files are plain files here: what the wrapper writes into them is what the kernel reads
// (0: "the writing process"), and the command still runs with its pid, args and output.

const run = promisify(execFile);
let dir: string | undefined;

afterEach(async () => {
  setUserCgroup([]);
  if (dir) await rm(dir, { recursive: true, force: true });
});

it("runs the command as is when no user cgroup was given", () => {
  expect(asUserProcess("bash", ["-c", "x"])).toEqual(["bash", ["-c", "x"]]);
});

it("joins every procs file, raises the OOM score, then execs the command with its arguments", async () => {
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-user-spawn-"));
  const files = [path.join(dir, "memory"), path.join(dir, "pids")];
  for (const f of files) await writeFile(f, "");
  setUserCgroup(files);
  const [file, args] = asUserProcess("bash", ["-c", 'echo "$0 $1"; cat /proc/self/oom_score_adj', "a b", "c"]);
  const { stdout } = await run(file, args);
  expect(stdout).toBe(`a b c\n${USER_OOM_SCORE_ADJ}\n`);
  for (const f of files) expect(await readFile(f, "utf8")).toBe("0\n");
});

it("still runs the command when a procs file cannot be written", async () => {
  setUserCgroup(["/nonexistent/cgroup.procs"]);
  const [file, args] = asUserProcess("echo", ["ran"]);
  const { stdout, stderr } = await run(file, args);
  expect(stdout).toBe("ran\n");
  expect(stderr).toBe("");
});

it("leaves a command that is not on PATH as it is, so spawning it fails with ENOENT as before", async () => {
  setUserCgroup(["/nonexistent/cgroup.procs"]);
  expect(asUserProcess("no-such-command-here", ["x"], { PATH: "/usr/bin:/bin" })).toEqual(["no-such-command-here", ["x"]]);
  expect(asUserProcess("echo", ["x"], { PATH: "/usr/bin:/bin" })[0]).toBe("/bin/sh");
  expect(asUserProcess("/bin/echo", ["x"], {})[0]).toBe("/bin/sh");
});

it("joins from inside a shell with the prelude the subshell hosts run (no wrapper exec), quoting the paths", async () => {
  expect(userJoinPrelude()).toBe("");
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-user-spawn-"));
  const files = [path.join(dir, "it's memory"), path.join(dir, "pids $(x)")];
  for (const f of files) await writeFile(f, "");
  setUserCgroup([...files, "/nonexistent/cgroup.procs"]);
  const { stdout, stderr } = await run("bash", ["-c", userJoinPrelude() + 'echo "$$"; cat /proc/self/oom_score_adj']);
  const [pid, score] = stdout.trim().split("\n");
  expect(score).toBe(String(USER_OOM_SCORE_ADJ));
  expect(stderr).toBe("");
  for (const f of files) expect(await readFile(f, "utf8")).toBe("0\n");
  expect(Number(pid)).toBeGreaterThan(0);
});

it("strictly, a shell that cannot join exits 127 before running anything", async () => {
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-user-spawn-"));
  const ok = path.join(dir, "joinable");
  await writeFile(ok, "");
  setUserCgroup([ok, "/nonexistent/cgroup.procs"]);
  const refused = await run("bash", ["-c", `${userJoinPrelude(true)}echo ran`]).then(() => undefined, (err: { code?: number; stdout?: string }) => err);
  expect(refused).toMatchObject({ code: 127, stdout: "" });
  setUserCgroup([ok]);
  expect((await run("bash", ["-c", `${userJoinPrelude(true)}echo ran`])).stdout).toBe("ran\n");
});
