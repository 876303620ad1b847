import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, expect, it } from "vitest";
import { ShellSpawner, type SpawnedShell } from "./shell-spawner.ts";

// The spawner as the launcher uses it, with real processes. Outside a sandbox the user cgroup's
// procs files are plain files: what the spawner writes into them is what the kernel would read.

let spawner: ShellSpawner | undefined;
let dir: string | undefined;
afterEach(async () => {
  spawner?.stop();
  spawner = undefined;
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = undefined;
});

/** A spawner whose shells and failures queue up for the test to take. */
function start(files: string[] = []) {
  const shells: SpawnedShell[] = [];
  const failures: string[] = [];
  let wake = () => undefined as void;
  const s = new ShellSpawner(
    files,
    (shell) => {
      shells.push(shell);
      wake();
    },
    (reason) => {
      failures.push(reason);
      wake();
    },
  );
  const next = async <T>(q: T[]): Promise<T> => {
    while (q.length === 0) await new Promise<void>((r) => (wake = r));
    return q.shift()!;
  };
  return { s, shell: () => next(shells), failure: () => next(failures) };
}

const BOOT = 'IFS= read -r -d "" s <&3 || exit 0; exec 3<&-; eval "$s"';

function output(shell: SpawnedShell): Promise<{ out: string; code: number | null; signal: string | null }> {
  const chunks: Buffer[] = [];
  shell.stdout!.on("data", (c: Buffer) => chunks.push(c));
  shell.stderr!.on("data", (c: Buffer) => chunks.push(c));
  return new Promise((resolve) => {
    let open = 3;
    let code: number | null = null;
    let signal: string | null = null;
    const done = () => --open === 0 && resolve({ out: Buffer.concat(chunks).toString(), code, signal });
    shell.stdout!.once("close", done);
    shell.stderr!.once("close", done);
    if (shell.exited) {
      code = shell.exitCode;
      signal = shell.signalCode;
      done();
    } else
      shell.once("exit", (c: number | null, sig: string | null) => {
        code = c;
        signal = sig;
        done();
      });
  });
}

it("starts shells with the env and cwd asked for, hands over their pipes and reports their exit", async () => {
  const t = start();
  spawner = t.s;
  expect(spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/tmp", env: { PATH: process.env.PATH, GREETING: "hi" } })).toBe(true);
  const shell = await t.shell();
  expect(shell.pid).toBeGreaterThan(0);
  // Its parent is the spawner, not this process.
  const ppid = Number(readFileSync(`/proc/${shell.pid}/stat`, "latin1").split(") ")[1]!.split(" ")[1]);
  expect(ppid).not.toBe(process.pid);
  const done = output(shell);
  shell.input!.end('echo "$GREETING from $PWD"; echo oops >&2; exit 5\0');
  expect(await done).toEqual({ out: "hi from /tmp\noops\n", code: 5, signal: null });
});

it("joins the user cgroup's procs files before serving, and says whether it could", async () => {
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-spawner-"));
  const files = [path.join(dir, "memory"), path.join(dir, "pids")];
  for (const f of files) await writeFile(f, "");
  const ok = start(files);
  spawner = ok.s;
  spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/", env: {} });
  await ok.shell();
  expect(spawner.joined).toBe(true);
  for (const f of files) expect(await readFile(f, "utf8")).toBe("0");
  spawner.stop();

  const bad = start([files[0]!, "/nonexistent/cgroup.procs"]);
  spawner = bad.s;
  spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/", env: {} });
  await bad.shell();
  expect(spawner.joined).toBe(false);
});

it("reports a request that starts nothing, and keeps serving", async () => {
  const t = start();
  spawner = t.s;
  spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/no/such/dir", env: {} });
  expect(await t.failure()).toMatch(/ENOENT/);
  spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/", env: {} });
  const shell = await t.shell();
  const done = output(shell);
  shell.input!.end("echo still\0");
  expect((await done).out).toBe("still\n");
});

it("ends its shells with it and reports them killed; a stopped spawner takes no requests", async () => {
  const t = start();
  spawner = t.s;
  spawner.request({ file: "bash", args: ["-c", BOOT], cwd: "/", env: {} });
  const shell = await t.shell();
  const done = output(shell);
  spawner.stop();
  expect(await done).toMatchObject({ code: null, signal: "SIGKILL" });
  expect(spawner.alive).toBe(false);
  expect(spawner.request({ file: "bash", args: [], cwd: "/", env: {} })).toBe(false);
});
