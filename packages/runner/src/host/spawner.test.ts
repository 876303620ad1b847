import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, readlink, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { CommandError, run, which } from "./command.ts";
import { launch } from "../linux/launcher.ts";
import { readySpawner, spawner } from "./spawner.ts";
import { fixture, leftovers, sh, uniqueId } from "../linux/testing/harness.ts";

// The runner's spawner process (spawner.ts): commands and launches started by it answer as they
// do when started here (output, stdin, exit codes, failures to start, exits of what was launched),
// and a helper that dies leaves callers spawning for themselves until a new one is up.

let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-spawner-"));
  expect(await readySpawner()).toBeDefined();
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

it("runs commands from the helper process, not from this one", async () => {
  const helper = spawner()!;
  const { stdout } = await run("sh", ["-c", "echo $PPID"]);
  expect(Number(stdout.trim())).toBe(helper.pid);
  expect(Number(stdout.trim())).not.toBe(process.pid);
});

it("what it starts does not inherit its channel to the runner (a sandbox could speak for the helper)", async () => {
  const helper = spawner()!;
  const sockets = async (pid: number | string) => {
    const dir = `/proc/${pid}/fd`;
    const links = await Promise.all((await readdir(dir)).map((fd) => readlink(path.join(dir, fd)).catch(() => "")));
    return links.filter((l) => l.startsWith("socket:"));
  };
  const own = await sockets(helper.pid!);
  expect(own.length).toBeGreaterThan(0); // its IPC channel
  const { stdout } = await run("sh", ["-c", 'for f in /proc/$$/fd/*; do readlink "$f" || true; done']);
  const inherited = stdout.split("\n").filter((l) => own.includes(l));
  expect(inherited).toEqual([]);
});

it("passes stdin, cwd and env, and returns the whole output (bytes checked by hash)", async () => {
  const input = randomBytes(30_000).toString("hex"); // 60 000 bytes: under run()'s 64 KiB output cap
  const { stdout } = await run("sh", ["-c", 'cat; pwd; echo "$SPAWNER_TEST"'], { input: input + "\n", cwd: dir, env: { PATH: process.env.PATH, SPAWNER_TEST: "x y" } });
  const lines = stdout.split("\n");
  expect(createHash("sha256").update(lines[0]!).digest("hex")).toBe(createHash("sha256").update(input).digest("hex"));
  expect(lines.slice(1)).toEqual([dir, "x y", ""]);
});

it("reports a failing command's exit code and stderr, a killed one's signal, and one that cannot start", async () => {
  const failed = await run("sh", ["-c", "echo nope >&2; exit 3"]).catch((e: unknown) => e);
  expect(failed).toBeInstanceOf(CommandError);
  expect((failed as CommandError).code).toBe(3);
  expect((failed as CommandError).stderr).toBe("nope\n");
  expect((failed as Error).message).toContain("exited with 3: nope");
  const killed = await run("sh", ["-c", "kill -TERM $$"]).catch((e: unknown) => e);
  expect((killed as Error).message).toContain("was killed by SIGTERM");
  await expect(run("/nonexistent/sandbar-tool", [])).rejects.toThrow(/cannot run \/nonexistent\/sandbar-tool: .*ENOENT/);
});

it("launches detached, tells the launched process's exit, its pid and the OOM score it set", async () => {
  const logFile = path.join(dir, "launch.log");
  const child = await launch({
    bwrap: which("bwrap")!, setpriv: which("setpriv")!, hostUid: 1_690_800_000, hostGid: 1_690_800_000, procsFiles: [],
    bwrapOptions: ["--unshare-user", "--unshare-pid", "--as-pid-1", "--uid", "1000", "--gid", "1000", "--ro-bind", "/", "/", "--proc", "/proc"],
    command: ["/bin/sh", "-c", "cat /proc/self/oom_score_adj; exit 7"], logFile, oomScoreAdj: 300,
  });
  expect(child.pid).toBeGreaterThan(0);
  const [code] = await new Promise<[number | null, string | null]>((resolve) => child.once("exit", (c, s) => resolve([c, s])));
  expect(code).toBe(7);
  expect(child.exitCode).toBe(7);
  expect(await readFile(logFile, "utf8")).toBe("300\n");
  // A launch that cannot open its log fails as it does here.
  await expect(launch({ bwrap: "/bin/true", setpriv: "/bin/true", hostUid: 1, hostGid: 1, procsFiles: [], bwrapOptions: [], command: ["x"], logFile: path.join(dir, "missing", "log") })).rejects.toThrow(/ENOENT/);
});

it("outlives the signals of its process group (the runner's shutdown still needs it), and what it runs is out of that group", async () => {
  const helper = spawner()!;
  const pending = run("sh", ["-c", 'read line; ps -o pgid= -p $$; echo "$line"'], { input: "after\n" });
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.kill(helper.pid!, signal);
  const [pgid, line] = (await pending).stdout.trim().split(/\s+/);
  expect(line).toBe("after");
  // Its own group: a Ctrl-C to the runner's group does not cut a teardown's umount short.
  expect(Number(pgid)).not.toBe(Number((await readFile(`/proc/${helper.pid}/stat`, "utf8")).split(") ")[1]!.split(" ")[2]));
  expect(spawner()?.pid).toBe(helper.pid);
  expect(Number((await run("sh", ["-c", "echo $PPID"])).stdout.trim())).toBe(helper.pid);
});

it("a helper that dies fails what it was asked, callers then spawn here, and a new helper takes over", async () => {
  const first = spawner()!;
  const pending = run("sleep", ["5"]);
  await new Promise((r) => setTimeout(r, 50));
  first.kill();
  await expect(pending).rejects.toThrow("the runner's spawner process exited");
  // Gone: the next call spawns from this process while a new helper starts.
  const { stdout } = await run("sh", ["-c", "echo $PPID"]);
  expect(Number(stdout.trim())).toBe(process.pid);
  const second = await readySpawner();
  expect(second).toBeDefined();
  expect(second!.pid).not.toBe(first.pid);
  expect(Number((await run("sh", ["-c", "echo $PPID"])).stdout.trim())).toBe(second!.pid);
});

it("a sandbox the helper launched outlives the helper: it answers, stops and starts again, leaving nothing behind", async () => {
  const f = await fixture();
  try {
    await readySpawner();
    const helper = spawner()!;
    const id = uniqueId("spawned");
    const { hostUid } = await f.provider.create(f.spec(id, { diskGiB: 1 }));
    await f.provider.start(id);
    // The sandbox's first process (the launcher, bwrap by now) is the helper's child.
    const first = (await f.provider.cgroups.pids(id))[0]!;
    const ppidOf = async (pid: number) => Number(/^PPid:\s+(\d+)$/m.exec(await readFile(`/proc/${pid}/status`, "utf8"))![1]);
    const launcher = await (async () => {
      for (let pid = first; pid > 1; pid = await ppidOf(pid)) if ((await ppidOf(pid)) === helper.pid) return pid;
      return undefined;
    })();
    expect(launcher).toBeDefined();
    helper.kill();
    await new Promise((r) => setTimeout(r, 100));
    expect((await sh(f.provider, id, "echo alive")).stdout).toBe("alive\n");
    expect((await f.provider.inspect(id)).state).toBe("started");
    await f.provider.stop(id, { force: true });
    await f.provider.start(id); // launched from here or from a new helper
    expect((await sh(f.provider, id, "echo again")).stdout).toBe("again\n");
    await f.provider.destroy(id);
    expect(await leftovers(f.provider, id, hostUid)).toEqual([]);
  } finally {
    await f.provider.close();
    await rm(f.dataDir, { recursive: true, force: true });
  }
});
