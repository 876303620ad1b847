import { rm } from "node:fs/promises";
import { afterAll, beforeAll, expect, it } from "vitest";
import { sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import { leftovers } from "./testing/leaks.ts";
import { buildAgentBundle } from "../testing/agent-bundle.ts";

// Sandboxes running the real agent (packages/agent, bundled by its build.ts into a scratch
// directory), reached through the toolbox the way clients reach it.

let bundle: string;
let f: SandboxFixture;

beforeAll(async () => {
  bundle = await buildAgentBundle();
  f = await sandboxFixture({ agentBundle: bundle });
});

afterAll(async () => {
  await f?.stop();
  await rm(bundle, { recursive: true, force: true });
});

it("runs the real agent: toolbox calls work, files survive stop/start and archive/start, delete leaves nothing", async () => {
  const s = await f.create({ env: { PROJECT: "sandbar" } });
  expect(s.state).toBe("started");
  const execute = (command: string) => f.call("POST", `/toolbox/${s.id}/toolbox/process/execute`, { command });

  const first = await execute('echo "$PROJECT" > ~/kept && cat ~/kept && id -un');
  expect(first.status, JSON.stringify(first.body)).toBe(200);
  expect(first.body).toEqual({ exitCode: 0, result: "sandbar\nsandbar\n" });
  expect((await f.exec(s.id, "cat ~/kept")).result).toBe("sandbar\n");
  // The bundle holds a startup snapshot built by this node: the sandbox's agent starts from it.
  const commands = await execute("cat /proc/[0-9]*/cmdline | tr '\\0' ' '");
  expect(commands.body.result).toContain(`/opt/sandbar/bin/node --use-openssl-ca --snapshot-blob /opt/sandbar/agent/agent-${process.version}-${process.arch}.blob /opt/sandbar/agent/agent.mjs`);

  await f.call("POST", `/sandbox/${s.id}/stop`);
  expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
  expect((await execute("cat ~/kept")).body.result).toBe("sandbar\n");

  await f.call("POST", `/sandbox/${s.id}/stop`);
  expect((await f.call("POST", `/sandbox/${s.id}/archive`)).body.state).toBe("archived");
  expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
  expect((await execute("cat ~/kept")).body.result).toBe("sandbar\n");

  const { hostUid } = await f.runtime.provider.inspect(s.id);
  expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
  expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
});

it("the agent in a sandbox reads the bundle's compile cache (made at build time) rather than compiling its modules again", async () => {
  const s = await f.create({});
  // The agent's own node and entry, as the sandbox user; a bad argument ends it once its modules are loaded.
  const r = await f.exec(s.id, "NODE_DEBUG_NATIVE=COMPILE_CACHE /opt/sandbar/bin/node /opt/sandbar/agent/agent.mjs --no-such-flag 2>&1; id -u");
  expect(r.result).toMatch(/V8 code cache for ESM file:\/\/\/opt\/sandbar\/agent\/main\.mjs was accepted/);
  expect(r.result).not.toMatch(/Cannot create cache directory|was rejected/);
  expect(r.result.trim().split("\n").at(-1)).toBe("1000");
  await f.call("DELETE", `/sandbox/${s.id}`);
});

it("runs executions in subshells of a host bash that lives in the user cgroup, at the user's OOM score", async () => {
  const s = await f.create({});
  // The first execution runs in a shell of its own; hosts start after it has answered. The
  // subshell's parent is the host (or a job whose parent is the host, for executions side by
  // side; $BASHPID read outside `$(...)`).
  const where = 'me=$BASHPID; job=$(awk "{print \\$4}" /proc/$me/stat); host=$(awk "{print \\$4}" /proc/$job/stat); ' +
    'grep -qa __sandbar_slot /proc/$job/cmdline && host=$job; ' +
    'grep -qa __sandbar_slot /proc/$host/cmdline && echo host; grep -E ":(pids|memory):" /proc/$host/cgroup; cat /proc/$host/oom_score_adj /proc/$me/oom_score_adj';
  let r = await f.exec(s.id, where);
  for (let i = 0; i < 40 && !r.result.startsWith("host\n"); i++) r = await f.exec(s.id, where);
  // The sandbox's cgroup namespace is rooted at the agent leaf: the user leaf reads "/../user".
  const m = /^host\n\d+:(?:pids|memory):(.*)\n\d+:(?:pids|memory):(.*)\n(-?\d+)\n(-?\d+)\n$/.exec(r.result);
  expect(m, r.result).not.toBeNull();
  const [, cg1, cg2, hostScore, shellScore] = m!;
  expect([cg1, cg2]).toEqual(["/../user", "/../user"]);
  expect(hostScore).toBe("1000");
  expect(shellScore).toBe("1000");
  await f.call("DELETE", `/sandbox/${s.id}`);
});
