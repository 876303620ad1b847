import { chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { which } from "../host/command.ts";
import { AGENT_OOM_SCORE_ADJ, launch, type LaunchOptions } from "./launcher.ts";

// launch() with the real sh -> setpriv -> bwrap chain (as root), a shell as the sandbox's first
// process reporting what it started with.

const UID = 1_690_700_000 + (process.pid % 10_000);
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-launcher-"));
  await chmod(dir, 0o777);
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Runs `script` as the first process of a bare bwrap sandbox (the host's / read-only); its output. */
async function firstProcess(script: string, extra: Partial<LaunchOptions> = {}): Promise<{ output: string; oomScoreDenied: boolean }> {
  const logFile = path.join(dir, `log-${Math.random().toString(36).slice(2)}`);
  const child = await launch({
    bwrap: which("bwrap")!,
    setpriv: which("setpriv")!,
    hostUid: UID,
    hostGid: UID,
    procsFiles: [],
    bwrapOptions: ["--unshare-user", "--unshare-pid", "--as-pid-1", "--uid", "1000", "--gid", "1000", "--ro-bind", "/", "/", "--proc", "/proc"],
    command: ["/bin/sh", "-c", script],
    logFile,
    ...extra,
  });
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  const output = await readFile(logFile, "utf8");
  expect(code, output).toBe(0);
  return { output, oomScoreDenied: child.oomScoreDenied };
}

/** Whether this process may lower OOM scores (CAP_SYS_RESOURCE; some hosts' root lacks it). */
async function mayLowerScores(): Promise<boolean> {
  const eff = /^CapEff:\s*([0-9a-f]+)$/m.exec(await readFile("/proc/self/status", "utf8"))![1]!;
  return (BigInt(`0x${eff}`) & (1n << 24n)) !== 0n;
}

it("sets the OOM score on the launcher before bwrap forks: the sandbox's first process starts with it, and its children inherit it", async () => {
  // Raising needs no privilege, so this holds on every host. The first thing pid 1 does is read
  // its own score; a child of it reads its own too.
  const r = await firstProcess("cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'", { oomScoreAdj: 500 });
  expect(r.oomScoreDenied).toBe(false);
  expect(r.output).toBe("500\n500\n");
});

it("the agent's score: -1000 from the first instruction where the host may lower it, else reported as denied", async () => {
  const own = (await readFile("/proc/self/oom_score_adj", "utf8")).trim();
  const r = await firstProcess("cat /proc/self/oom_score_adj", { oomScoreAdj: AGENT_OOM_SCORE_ADJ });
  if (await mayLowerScores()) {
    expect(r.oomScoreDenied).toBe(false);
    expect(r.output).toBe("-1000\n");
  } else {
    expect(r.oomScoreDenied).toBe(true);
    expect(r.output).toBe(`${own}\n`);
  }
});

it("leaves the score alone when none is asked for", async () => {
  const r = await firstProcess("cat /proc/self/oom_score_adj");
  expect(r.oomScoreDenied).toBe(false);
  expect(r.output).toBe(`${(await readFile("/proc/self/oom_score_adj", "utf8")).trim()}\n`);
});
