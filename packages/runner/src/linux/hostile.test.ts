import { randomBytes } from "node:crypto";
import { readFile, rm } from "node:fs/promises";
import { createClient } from "@connectrpc/connect";
import { agentTransport } from "@sandbar/agent";
import { buildAgentBundle } from "@sandbar/agent/testing";
import { type CommandLogs, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SandboxSpec } from "../provider.ts";
import { sleep } from "./cgroups/types.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sandboxAgent, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Hostile workloads against real sandboxes running the real agent: after each, the sandbox's
// next toolbox call (an execute through the agent) must succeed within 5 s, and the sandbox
// reports what happened (OOM kills, pids-limit hits, agent restarts). Small limits keep it quick.

const RECOVER_MS = 5000;
const LIMITS = { memoryGiB: 0.25, pidsLimit: 128, cpu: 1 } satisfies Partial<SandboxSpec>;

let f: Fixture;
let bundle: string;
const secret = randomBytes(16).toString("hex");
const created: string[] = [];
const figures: Record<string, number> = {};

beforeAll(async () => {
  bundle = await buildAgentBundle("sandbar-hostile-agent-");
  f = await fixture();
}, 120_000);

afterAll(async () => {
  await disposeFixture(f, created);
  if (bundle) await rm(bundle, { recursive: true, force: true });
  console.log(`hostile workloads, time to the next successful toolbox call (ms): ${JSON.stringify(figures)}`);
});

async function started(prefix: string, over: Partial<SandboxSpec> = {}): Promise<string> {
  const id = uniqueId(prefix);
  created.push(id);
  const base = f.spec(id, { ...LIMITS, ...over });
  await f.provider.create({ ...base, init: { node: base.init.node, bundle, main: "agent.mjs", secret } });
  await f.provider.start(id);
  return id;
}

async function execute(id: string, command: string, timeoutMs = 30_000): Promise<{ exitCode: number; result: string }> {
  const proc = createClient(ProcessService, agentTransport(await f.provider.connect(id), secret));
  const res = await proc.execute({ command, envs: {} }, { timeoutMs });
  return { exitCode: res.exitCode, result: res.result };
}

/** Time until `echo ok` through the agent succeeds; fails the test past RECOVER_MS. */
async function recovers(name: string, id: string): Promise<number> {
  const t0 = Date.now();
  let last: unknown;
  while (Date.now() - t0 < RECOVER_MS) {
    try {
      const res = await execute(id, "echo ok", Math.max(100, RECOVER_MS - (Date.now() - t0)));
      if (res.result === "ok\n") {
        figures[name] = Date.now() - t0;
        return figures[name];
      }
      last = new Error(`unexpected answer ${JSON.stringify(res)}`);
    } catch (err) {
      last = err;
    }
    await sleep(25);
  }
  throw new Error(`${name}: no successful toolbox call within ${RECOVER_MS} ms: ${String(last)}`);
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = await read();
  while (!ok(v) && Date.now() < deadline) {
    await sleep(50);
    v = await read();
  }
  return v;
}

describe("the agent's reserve", () => {
  it("runs what it starts for the user in the user leaf with a raised OOM score; itself in the agent leaf", async () => {
    const id = await started("leaves");
    // The sandbox's cgroup namespace is rooted at the agent leaf: the user leaf reads "/../user".
    const res = await execute(id, "grep -E ':(pids|memory):' /proc/self/cgroup; cat /proc/self/oom_score_adj");
    expect(res.result).toMatch(/^\d+:pids:\/\.\.\/user\n\d+:memory:\/\.\.\/user\n1000\n$/);
    const proc = createClient(ProcessService, agentTransport(await f.provider.connect(id), secret));
    await proc.createSession({ sessionId: "s" });
    const cmd = await proc.sessionExecute({ sessionId: "s", command: "grep -c /../user /proc/self/cgroup" });
    expect(Number(streamText(await proc.getSessionCommandLogs({ sessionId: "s", commandId: cmd.cmdId }), "stdout").trim())).toBeGreaterThanOrEqual(2);
    const agent = await sandboxAgent(f.provider, id);
    expect(await f.provider.cgroups.agentPids(id)).toContain(agent);
    const user = await readFile(f.provider.cgroups.userProcsFiles(id).find((p) => p.includes("/pids/"))!, "utf8");
    expect(user.trim().split("\n").length).toBeGreaterThanOrEqual(1); // the session's shell (and the warm spare)
  });
});

describe("hostile workloads: the agent keeps answering", () => {
  it("a fork storm past the pids limit, kept at the limit for 8 s", async () => {
    const id = await started("fork");
    // Forks as fast as it can for 8 s, each child lingering 4 s: the user leaf stays full.
    const storm = "import os, time\nend = time.time() + 8\nwhile time.time() < end:\n    try:\n        if os.fork() == 0:\n            time.sleep(4); os._exit(0)\n    except OSError:\n        time.sleep(0.001)\n";
    await execute(id, `python3 -c '${storm}' >/dev/null 2>&1 &`);
    const hit = await until(() => f.provider.inspect(id), (i) => (i.usage?.pidsLimitHits ?? 0) > 0);
    expect(hit.usage?.pidsLimitHits).toBeGreaterThan(0);
    // The user leaf at its own limit reads as saturated (the sandbox's total is not reached: the agent's reserve).
    expect((await until(() => f.provider.inspect(id), (i) => i.usage?.pidsSaturated === true)).usage?.pidsSaturated).toBe(true);
    // The user leaf is full while the storm lasts; the agent's reserve is not.
    await recovers("forkStorm", id);
    const info = await f.provider.inspect(id);
    expect(info.usage!.pidsLimitHits).toBeGreaterThan(hit.usage!.pidsLimitHits); // still storming
    expect(info.agent).toMatchObject({ running: true, restarts: 0 });
    expect(info.usage?.pids).toBeLessThanOrEqual(LIMITS.pidsLimit);
  });

  it("a fork storm while executions run in a subshell host: they go on in shells of their own", async () => {
    const id = await started("forkhost");
    // Executions enough for the agent's subshell host to be running (it forks each execution's job).
    for (let i = 0; i < 6; i++) await execute(id, "true");
    const storm = "import os, time\nend = time.time() + 8\nwhile time.time() < end:\n    try:\n        if os.fork() == 0:\n            time.sleep(4); os._exit(0)\n    except OSError:\n        time.sleep(0.001)\n";
    await execute(id, `python3 -c '${storm}' >/dev/null 2>&1 &`);
    await until(() => f.provider.inspect(id), (i) => (i.usage?.pidsLimitHits ?? 0) > 0);
    // bash retries a refused fork for about 15 s: a host that cannot fork must not hold executions.
    await recovers("forkStormHost", id);
    for (let i = 0; i < 3; i++) expect(await execute(id, "echo again", RECOVER_MS)).toMatchObject({ exitCode: 0, result: "again\n" });
    expect((await f.provider.inspect(id)).agent).toMatchObject({ running: true, restarts: 0 });
  });

  it("a process allocating twice the memory limit", async () => {
    const id = await started("mem");
    const res = await execute(id, `python3 -c 'b = b"x" * (512 << 20); print(len(b))'`);
    expect(res.exitCode).toBe(137); // OOM-killed in the user leaf
    await recovers("memoryHog", id);
    const info = await f.provider.inspect(id);
    expect(info.usage?.oomKills).toBeGreaterThanOrEqual(1);
    expect(info.agent).toMatchObject({ running: true, restarts: 0 });
  });

  it("many processes allocating twice the memory limit together, each smaller than the agent", async () => {
    const id = await started("mem-many");
    // 16 x 32 MiB: the agent (node, ~50 MiB) is the largest process, so without its own leaf
    // and score it would be the OOM killer's first choice.
    const hog = `python3 -c 'import time; b = b"x" * (32 << 20); time.sleep(3)'`;
    await execute(id, `for i in $(seq 16); do ${hog} & done; wait; echo done`);
    await recovers("manyMemoryHogs", id);
    const info = await f.provider.inspect(id);
    expect(info.usage?.oomKills).toBeGreaterThanOrEqual(1);
    expect(info.agent).toMatchObject({ running: true, restarts: 0 });
  });

  it("a disk filled to its cap", async () => {
    const id = await started("disk", { diskGiB: 64 / 1024 });
    const res = await execute(id, "head -c 200M /dev/zero > ~/fill; echo rc=$?");
    expect(res.result).toContain("No space left on device");
    await recovers("diskFull", id);
    expect((await execute(id, "rm ~/fill && echo freed")).result).toBe("freed\n");
  });

  it("100,000 files in /tmp", async () => {
    const id = await started("files");
    const res = await execute(id, "mkdir /tmp/many && cd /tmp/many && seq 100000 | xargs touch && ls | wc -l");
    expect(res.result.trim()).toBe("100000");
    await recovers("manyFiles", id);
  });

  it("a process that kills every pid it can see (kill -9 -1): the agent comes back", async () => {
    const id = await started("killall");
    await execute(id, "kill -9 -1").catch(() => undefined); // the agent dies answering
    await recovers("killAll", id);
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("started");
    expect(info.agent?.restarts).toBeGreaterThanOrEqual(1);
  });

  it("a process that closes all its descriptors and spins", async () => {
    const id = await started("spin");
    const spin = "import os\nos.closerange(0, 65536)\nwhile True:\n    pass\n";
    await execute(id, `python3 -c '${spin}' & python3 -c '${spin}' &`);
    await sleep(300);
    await recovers("closeFdsAndSpin", id);
    expect(Number((await execute(id, "pgrep -c python3")).result.trim())).toBe(2);
  });

  it("filling /dev/shm", async () => {
    const id = await started("shm");
    const res = await execute(id, "head -c 1G /dev/zero > /dev/shm/fill; echo rc=$?; du -m /dev/shm/fill");
    expect(res.result).toContain("rc=1"); // its size is bounded below the user's memory budget
    await recovers("devShmFull", id);
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("started");
    expect(info.agent).toMatchObject({ running: true, restarts: 0 });
    // And the user can still run something that needs memory.
    expect((await execute(id, `python3 -c 'b = b"x" * (32 << 20); print(len(b))'`)).result).toBe(`${32 << 20}\n`);
  });
});

describe("the supervisor", () => {
  it("restarts the agent SIGKILLed from the host", async () => {
    const id = await started("sigkill");
    const agent = await sandboxAgent(f.provider, id);
    expect(agent).toBeDefined();
    process.kill(agent!, "SIGKILL");
    const down = await until(() => f.provider.inspect(id), (i) => i.agent?.restarts === 1, 2000);
    expect(down.agent?.restarts).toBe(1);
    await recovers("agentSigkill", id);
    const info = await f.provider.inspect(id);
    expect(info.agent?.running).toBe(true);
    expect(info.agent?.lastRestartAt).toBeInstanceOf(Date);
    expect(await sandboxAgent(f.provider, id)).not.toBe(agent);
  });

  it("brings sessions back after an agent restart: earlier commands' logs and exit codes, and a new shell", async () => {
    const id = await started("sessions");
    const proc = async () => createClient(ProcessService, agentTransport(await f.provider.connect(id), secret));
    const p1 = await proc();
    await p1.createSession({ sessionId: "work" });
    const done = await p1.sessionExecute({ sessionId: "work", command: "echo before; echo oops >&2" });
    expect(done.exitCode).toBe(0);
    const running = await p1.sessionExecute({ sessionId: "work", command: "echo started; sleep 300", runAsync: true });
    await sleep(200);
    process.kill((await sandboxAgent(f.provider, id))!, "SIGKILL");
    await recovers("agentRestartWithSessions", id);
    const p2 = await proc();
    expect((await p2.listSessions({})).sessions.map((x) => x.sessionId)).toEqual(["work"]);
    const before = await p2.getSessionCommandLogs({ sessionId: "work", commandId: done.cmdId });
    expect([streamText(before, "stdout"), streamText(before, "stderr")]).toEqual(["before\n", "oops\n"]);
    expect((await p2.getSessionCommand({ sessionId: "work", commandId: done.cmdId })).exitCode).toBe(0);
    expect(streamText(await p2.getSessionCommandLogs({ sessionId: "work", commandId: running.cmdId }), "stdout")).toBe("started\n");
    expect((await p2.getSessionCommand({ sessionId: "work", commandId: running.cmdId })).exitCode).toBe(-1); // ended with the old agent
    const after = await p2.sessionExecute({ sessionId: "work", command: "echo after" });
    expect(after.exitCode).toBe(0);
    expect(streamText(await p2.getSessionCommandLogs({ sessionId: "work", commandId: after.cmdId }), "stdout")).toBe("after\n");
  });

  it("stops gracefully: the agent gets SIGTERM through the init and exits before the grace ends", async () => {
    const id = await started("graceful");
    // A grace of ten minutes: the stop answers within the test's time only if the agent exited by itself.
    const info = await f.provider.stop(id, { graceMs: 600_000 });
    expect(info.state).toBe("stopped");
    expect(await readFile(f.provider.layout.initLog(id), "utf8")).toContain("sandbar-agent: stopping on SIGTERM");
  });
});

/** One stream's text from an answer's typed chunks. */
function streamText(logs: CommandLogs, stream: "stdout" | "stderr"): string {
  return Buffer.concat(logs.chunks.filter((c) => c.data.case === stream).map((c) => Buffer.from(c.data.value as Uint8Array))).toString();
}
