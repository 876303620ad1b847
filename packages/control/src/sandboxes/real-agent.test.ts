import { spawn } from "node:child_process";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import { leftovers } from "./testing/leaks.ts";

// Sandboxes running the real agent (packages/agent, bundled by its build.ts into a scratch
// directory), reached through the toolbox the way clients reach it.

const BUILD = fileURLToPath(new URL("../../../agent/build.ts", import.meta.url));

let bundle: string;
let f: SandboxFixture;

beforeAll(async () => {
  bundle = await mkdtemp(path.join(tmpdir(), "sandbar-agent-bundle-"));
  await chmod(bundle, 0o755); // sandbox users must reach the bind source
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [BUILD, bundle], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    child.stderr.on("data", (c: Buffer) => (err += c.toString()));
    child.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`agent build failed (${code}): ${err}`))));
  });
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
