import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { eventually } from "../../protocol/src/testing/eventually.ts";
import { MAIN, startAgentProcess } from "./testing/agent-process.ts";
import type { AgentProcess } from "./testing/agent-process.ts";
import { descendants } from "./util/kill.ts";

// The agent as the first process of a new PID namespace, as in a sandbox.
const canUnshare = spawnSync("unshare", ["--pid", "--fork", "--mount-proc", "true"]).status === 0;

describe.runIf(canUnshare)("as PID 1", () => {
  let agent: AgentProcess;
  beforeAll(async () => {
    agent = await startAgentProcess({ command: ["unshare", "--pid", "--fork", "--mount-proc", process.execPath, MAIN] });
  });
  afterAll(async () => {
    if (agent.child.exitCode === null) agent.child.kill("SIGKILL");
    await agent.stop();
  });

  it("becomes a reaping init with the agent as its child", async () => {
    const proc = agent.client(ProcessService);
    const init = await proc.execute({ command: "tr '\\0' ' ' < /proc/1/cmdline" });
    expect(init.result).toContain("sandbar-init");
    // Orphans: the subshells exit at once, their sleeps are re-parented to PID 1 and exit later.
    const orphans = await proc.execute({ command: "for i in 1 2 3 4 5; do (sleep 0.2 & echo $!); done" });
    const pids = orphans.result.trim().split("\n");
    expect(pids).toHaveLength(5);
    // Gone from /proc means exited and reaped (a zombie keeps its entry).
    const left = `for p in ${pids.join(" ")}; do [ -e /proc/$p ] && echo $p; done; true`;
    await eventually("the orphans to be reaped", async () => (await proc.execute({ command: left })).result === "");
    const states = await proc.execute({ command: "cat /proc/[0-9]*/stat 2>/dev/null" });
    const zombies = states.result.split("\n").filter((l) => /\) Z /.test(l));
    expect(zombies).toEqual([]);
    expect(states.result).toContain("(sh)"); // the init itself is there
  });

  it("forwards SIGTERM to the agent, which shuts down cleanly", async () => {
    const [init] = descendants(agent.child.pid!);
    expect(init).toBeGreaterThan(0);
    const exited = new Promise<number | null>((resolve) => agent.child.once("exit", (code) => resolve(code)));
    process.kill(init, "SIGTERM");
    expect(await exited).toBe(0);
    expect(existsSync(agent.socketPath)).toBe(false);
  });
});
