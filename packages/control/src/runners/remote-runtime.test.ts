import { randomBytes, createHash } from "node:crypto";
import http2 from "node:http2";
import { Code } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { AGENT_API_PATH, ERROR_HEADER, SANDBOX_ID_HEADER } from "@sandbar/runner/daemon";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, startRunnerProcess } from "./testing/runner-process.ts";

// One control server whose sandboxes live on a separate `sandbar runner` process (real
// processes, real sandboxes, loopback h2c): the lifecycle, the toolbox and the preview tunnel go
// through the runner's port; kill -9 of the runner and its return.

const root = process.getuid?.() === 0;
let runner: RunnerProcess;
let t: TestServer;
const call = (method: string, path: string, body?: unknown) => api(t.url, t.adminKey, method, path, body);
const exec = async (id: string, command: string) => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body as { exitCode: number; result: string };
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

async function waitState(id: string, state: string, ms = 60_000): Promise<void> {
  await eventually(`sandbox ${id} ${state}`, async () => (await call("GET", `/sandbox/${id}`)).body?.state === state, ms);
}

beforeAll(async () => {
  if (!root) return;
  runner = await startRunnerProcess();
  t = await startTestServer({ settings: { remoteRunner: { url: runner.url, credential: runner.credential } } });
}, 120_000);

afterAll(async () => {
  await t?.stop();
  await runner?.stop();
});

describe.skipIf(!root)("control with a runner process", () => {
  let id: string;

  it("creates a sandbox on the runner: the runner's id is the sandbox's, and the runner lists it", async () => {
    const r = await call("POST", "/sandbox", {});
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    id = r.body.id;
    expect(r.body.state).toBe("started");
    const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
    try {
      expect(t.server.sandboxes.runtime.runnerId).toBe(remote.runnerId);
      expect((await remote.list()).map((s) => s.id)).toContain(id);
      expect((await remote.inspect(id))?.health?.agentRunning).toBe(true);
    } finally {
      await remote.close();
    }
  }, 120_000);

  it("runs the toolbox through the runner: execute, upload and download (1 MiB, byte for byte)", async () => {
    expect(await exec(id, "echo hello from $(hostname)")).toMatchObject({ exitCode: 0, result: expect.stringContaining("hello from") });
    const data = randomBytes(1024 * 1024);
    const form = new FormData();
    form.append("file", new Blob([data]), "x.bin");
    const up = await fetch(`${t.url}/api/toolbox/${id}/toolbox/files/upload?path=/tmp/x.bin`, { method: "POST", body: form, headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(up.status, await up.clone().text()).toBe(200);
    expect((await exec(id, "sha256sum /tmp/x.bin")).result.split(" ")[0]).toBe(sha(data));
    const down = await fetch(`${t.url}/api/toolbox/${id}/toolbox/files/download?path=/tmp/x.bin`, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(down.status).toBe(200);
    expect(sha(new Uint8Array(await down.arrayBuffer()))).toBe(sha(data));
  }, 60_000);

  it("reaches a port inside the sandbox through the preview proxy (the agent's tunnel over the runner)", async () => {
    const session = "web";
    const made = await call("POST", `/toolbox/${id}/toolbox/process/session`, { sessionId: session });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    await exec(id, "mkdir -p /tmp/www && echo remote-page > /tmp/www/index.html");
    const run = await call("POST", `/toolbox/${id}/toolbox/process/session/${session}/exec`, { command: "cd /tmp/www && python3 -m http.server 8000 --bind 127.0.0.1", runAsync: true });
    expect(run.status, JSON.stringify(run.body)).toBe(202);
    let page = "";
    await eventually("the app to answer through the proxy", async () => {
      const r = await fetch(`${t.url}/api/preview-proxy/${id}/8000/index.html`, { headers: { authorization: `Bearer ${t.adminKey}` } });
      page = await r.text();
      return r.status === 200;
    }, 30_000);
    expect(page).toBe("remote-page\n");
  }, 60_000);

  it("reads the sandbox's changes through the runner: entries, a page's cursor and the tar (GetSandboxChanges)", async () => {
    const listed = await call("GET", `/sandbox/${id}/changes?pathPrefix=/tmp`);
    expect(listed.status, JSON.stringify(listed.body)).toBe(200);
    const paths = (listed.body.items as Array<{ path: string; kind: string; type: string }>).map((c) => `${c.kind} ${c.type} ${c.path}`);
    expect(paths).toEqual(expect.arrayContaining(["added file /tmp/x.bin", "added directory /tmp/www", "added file /tmp/www/index.html"]));
    const page = await call("GET", `/sandbox/${id}/changes?pathPrefix=/tmp&limit=1`);
    expect(page.body.items).toHaveLength(1);
    expect(page.body.nextCursor).toBe(page.body.items[0].path);
    const tar = await fetch(`${t.url}/api/sandbox/${id}/changes?format=tar&pathPrefix=/tmp/www`, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(tar.status).toBe(200);
    const bytes = Buffer.from(await tar.arrayBuffer());
    expect(bytes.subarray(0, 9).toString()).toBe("tmp/www/\0");
    expect(bytes.includes(Buffer.from("remote-page\n"))).toBe(true);
  }, 60_000);

  it("stops, starts, archives and restores through the runner (pack and restore streams)", async () => {
    await exec(id, "echo kept > ~/marker");
    expect((await call("POST", `/sandbox/${id}/stop`)).status).toBeLessThan(300);
    await waitState(id, "stopped");
    expect((await call("POST", `/sandbox/${id}/archive`)).status).toBeLessThan(300);
    await waitState(id, "archived", 120_000);
    expect((await call("POST", `/sandbox/${id}/start`)).status).toBeLessThan(300);
    await waitState(id, "started", 120_000);
    expect((await exec(id, "cat ~/marker")).result).toBe("kept\n");
  }, 300_000);

  it("pauses and resumes through the runner (PauseSandbox, ResumeSandbox); a toolbox call resumes a paused sandbox", async () => {
    const paused = await call("POST", `/sandbox/${id}/pause`);
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    expect(paused.body.state).toBe("paused");
    const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
    try {
      const seen = await remote.inspect(id);
      expect(seen?.state).toBe("paused");
      expect(seen?.pausedMemory?.residentBytes).toBeGreaterThan(0);
      expect((await call("POST", `/sandbox/${id}/start`)).body.state).toBe("started");
      expect((await remote.inspect(id))?.state).toBe("started");
      await call("POST", `/sandbox/${id}/pause`);
      expect((await exec(id, "cat ~/marker")).result).toBe("kept\n");
      expect((await remote.inspect(id))?.state).toBe("started");
    } finally {
      await remote.close();
    }
  }, 120_000);

  it("refuses a wrong runner credential, on RPCs and on agent streams", async () => {
    await expect(RemoteRuntime.open({ url: runner.url, credential: "x".repeat(32) })).rejects.toMatchObject({ code: Code.Unauthenticated });
    const session = http2.connect(runner.url);
    try {
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
        const s = session.request({ ":method": "POST", ":path": AGENT_API_PATH, authorization: "Bearer " + "y".repeat(32), [SANDBOX_ID_HEADER]: id });
        s.once("response", resolve);
        s.once("error", reject);
        s.end();
      });
      expect(headers[":status"]).toBe(401);
      expect(headers[ERROR_HEADER]).toBe("Invalid runner credential");
    } finally {
      session.close();
    }
  });

  it("kill -9 of the runner: the sandbox keeps running; once the runner is back the toolbox reaches it again", async () => {
    await runner.kill();
    const down = await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command: "true" });
    expect(down.status).toBeGreaterThanOrEqual(500);
    expect(JSON.stringify(down.body)).not.toContain("An unexpected error occurred");
    await runner.restart();
    await eventually("the toolbox to answer again", async () => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command: "cat ~/marker" })).body?.result === "kept\n", 30_000);
  }, 90_000);

  it("deletes the sandbox from the runner", async () => {
    expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
    const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
    try {
      await eventually("the runner to forget it", async () => (await remote.inspect(id)) === undefined, 30_000);
    } finally {
      await remote.close();
    }
  }, 60_000);
});
