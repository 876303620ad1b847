import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { startAgent, type Agent } from "@sandbar/agent";
import { api, startTestServer, type TestServer } from "@sandbar/control/testing";
import { errors } from "@sandbar/protocol";
import { unixAgentDial } from "../packages/control/src/sandboxes/runtime.ts";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// The toolbox path through the control plane to a real agent process on a unix socket. The
// locator (which sandbox lives where) is the one piece stood in for: it names this agent as
// sandbox "sbx-1"; the lifecycle suites cover locating agents of real sandboxes.

let t: TestServer;
let agent: Agent;
let dir: string;
const touched: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sandbar-toolbox-"));
  const secret = randomBytes(16).toString("hex");
  agent = await startAgent({ socketPath: join(dir, "agent.sock"), secret, root: dir, log: () => {} });
  t = await startTestServer({
    control: {
      agentLocator: {
        agentFor: async (_org, idOrName) => {
          if (idOrName !== "sbx-1") throw errors.notFound(`Sandbox with ID or name ${idOrName} not found`);
          return { sandboxId: "sbx-1", ...unixAgentDial(agent.socketPath, secret) };
        },
        touch: (id) => touched.push(id),
      },
    },
  });
});
afterAll(async () => {
  await t?.stop();
  await agent?.close();
  await rm(dir, { recursive: true, force: true });
});

describe("REST toolbox", () => {
  it.each(["/toolbox/sbx-1/toolbox", "/toolbox-proxy/sbx-1"])("executes a command through %s", async (prefix) => {
    const res = await api(t.url, t.adminKey, "POST", `${prefix}/process/execute`, { command: "echo \"$GREETING\" from $(pwd)", envs: { GREETING: "it's $HOME" }, cwd: dir });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ exitCode: 0, result: `it's $HOME from ${dir}\n` });
    expect(touched).toContain("sbx-1");
  });

  it("lists and reads files of the sandbox", async () => {
    await writeFile(join(dir, "hello.txt"), "hi there");
    const list = await api(t.url, t.adminKey, "GET", `/toolbox/sbx-1/toolbox/files?path=${encodeURIComponent(dir)}`);
    expect(list.status).toBe(200);
    expect(list.body.map((f: { name: string }) => f.name)).toContain("hello.txt");
    const info = await api(t.url, t.adminKey, "GET", `/toolbox/sbx-1/toolbox/files/info?path=${encodeURIComponent(join(dir, "hello.txt"))}`);
    expect(info.body).toMatchObject({ name: "hello.txt", isDir: false, size: 8 });
  });

  it("passes the agent's errors through with their status", async () => {
    const res = await api(t.url, t.adminKey, "GET", `/toolbox/sbx-1/toolbox/files/info?path=${encodeURIComponent(join(dir, "nope"))}`);
    expect(res.status).toBe(404);
    expect(res.body.statusCode).toBe(404);
  });

  it("is 404 for a sandbox the caller cannot see, 401 without credentials, 403 without write:sandboxes", async () => {
    expect((await api(t.url, t.adminKey, "POST", "/toolbox/other/toolbox/process/execute", { command: "true" })).status).toBe(404);
    expect((await api(t.url, undefined, "POST", "/toolbox/sbx-1/toolbox/process/execute", { command: "true" })).status).toBe(401);
    const narrow = await api(t.url, t.adminKey, "POST", "/api-keys", { name: "read-only", permissions: [] });
    const denied = await api(t.url, narrow.body.value, "POST", "/toolbox/sbx-1/toolbox/process/execute", { command: "touch should-not-exist" });
    expect(denied.status).toBe(403);
    await expect(readFile(join(dir, "should-not-exist"))).rejects.toThrow();
  });
});

describe("gRPC toolbox on the control port", () => {
  it("forwards a call naming the sandbox in metadata", async () => {
    const client = createClient(ProcessService, createGrpcTransport({ baseUrl: t.url }));
    const headers = { authorization: `Bearer ${t.adminKey}`, "x-sandbar-sandbox-id": "sbx-1" };
    const res = await client.execute({ command: "echo grpc" }, { headers });
    expect(res.exitCode).toBe(0);
    expect(res.result).toBe("grpc\n");
    await expect(client.execute({ command: "true" }, { headers: { authorization: headers.authorization } })).rejects.toThrow(/x-sandbar-sandbox-id/);
  });
});
