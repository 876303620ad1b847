import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { freePort } from "@sandbar/runner/free-port";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { type RunnerProcess, startRunnerProcess } from "./testing/runner-process.ts";

// The runners API against a real server (embedded PostgreSQL): registration in a custom region
// with the credential answered once and kept sealed, the reference's checks and messages,
// scheduling and draining flags, delete rules, scopes; and control's health checks of a real
// `sandbar runner` process (ready with its capacity, unresponsive after kill -9, ready again).

const root = process.getuid?.() === 0;
let t: TestServer;
let region: string;
const call = (method: string, path: string, body?: unknown, key = t.adminKey) => api(t.url, key, method, path, body);

beforeAll(async () => {
  t = await startTestServer({ settings: { runnerChecks: { intervalMs: 200, unresponsiveMs: 1500 } } });
  const r = await call("POST", "/regions", { name: "edge-1" });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  region = r.body.id;
}, 120_000);

afterAll(async () => {
  await t?.stop();
});

describe("the runners API", () => {
  let id: string;

  it("registers a runner in the organization's custom region, answering its credential once and keeping it sealed", async () => {
    const r = await call("POST", "/runners", { regionId: region, name: "runner-a", tags: ["gpu-less"] });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body.apiKey).toMatch(/^sbrn_[0-9a-f]{64}$/);
    id = r.body.id;
    const rows = (await t.server.orm.em.getConnection().execute(`select credential_sealed from runner where id = ?`, [id])) as Array<{ credential_sealed: string }>;
    expect(rows[0]!.credential_sealed).not.toContain(r.body.apiKey.slice(5));
    const got = await call("GET", `/runners/${id}`);
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id, name: "runner-a", region, tags: ["gpu-less"], unschedulable: false, draining: false, runnerClass: "container" });
    expect(JSON.stringify(got.body)).not.toContain(r.body.apiKey);
    const list = await call("GET", "/runners");
    expect(list.body.map((x: { id: string }) => x.id)).toEqual([id]);
    expect((await call("GET", `/runners?regionId=${region}`)).body).toHaveLength(1);
  });

  it("checks what it is given, with the reference's messages", async () => {
    const bad = async (body: unknown, status: number, message: string) => {
      const r = await call("POST", "/runners", body);
      expect(r.status, JSON.stringify(r.body)).toBe(status);
      expect(r.body.message).toContain(message);
    };
    await bad({ regionId: region, name: "bad name!" }, 400, "Runner name must contain only letters, numbers, underscores, periods, and hyphens");
    await bad({ regionId: region, name: "ab" }, 400, "Runner name must be between 3 and 255 characters");
    await bad({ name: "runner-b" }, 400, "regionId should not be empty");
    await bad({ regionId: region, name: "runner-b", apiUrl: "ftp://x" }, 400, "apiUrl must be an http(s) URL");
    await bad({ regionId: region, name: "runner-b", cpu: -1 }, 400, "cpu must be a whole number");
    await bad({ regionId: "local", name: "runner-b" }, 403, "Runner can only be created in a custom region");
    await bad({ regionId: "nowhere", name: "runner-b" }, 404, "Region not found");
    await bad({ regionId: region, name: "runner-a" }, 409, "Runner with name runner-a already exists in this region");
    expect((await call("GET", "/runners?regionId=local")).status).toBe(403);
    expect((await call("GET", "/runners/not-a-uuid")).status).toBe(404);
    expect((await call("GET", "/runners/00000000-0000-4000-8000-000000000000")).body.message).toBe("Runner not found");
  });

  it("registers through /nodes too (the earlier CreateNode fields)", async () => {
    const r = await call("POST", "/nodes", { region: "edge-1", name: "node-1", apiUrl: "http://127.0.0.1:1", cpu: 4, memory: 8, disk: 50 });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    const got = await call("GET", `/runners/${r.body.id}`);
    expect(got.body).toMatchObject({ name: "node-1", apiUrl: "http://127.0.0.1:1", cpu: 4, memory: 8, disk: 50 });
    // The reference's node DTO takes any gpuType string and ignores it without GPUs ("none" from its dashboard).
    for (const [path, body] of [["/nodes", { region: "edge-1", name: "node-2" }], ["/runners", { regionId: region, name: "node-3" }]] as const) {
      const none = await call("POST", path, { ...body, gpu: 0, gpuType: "none" });
      expect(none.status, JSON.stringify(none.body)).toBe(201);
      const stored = await call("GET", `/runners/${none.body.id}`);
      expect(stored.body.gpuType ?? null).toBeNull();
      await call("PATCH", `/runners/${none.body.id}/scheduling`, { unschedulable: true });
      expect((await call("DELETE", `/runners/${none.body.id}`)).status).toBe(204);
    }
  });

  it("drains and takes out of scheduling; deletes only an unschedulable runner", async () => {
    expect((await call("PATCH", `/runners/${id}/draining`, { draining: true })).body).toMatchObject({ id, draining: true });
    expect((await call("DELETE", `/runners/${id}`)).body.message).toBe("Cannot delete runner which is available for scheduling sandboxes");
    expect((await call("PATCH", `/runners/${id}/scheduling`, { unschedulable: true })).body).toMatchObject({ id, unschedulable: true });
    expect((await call("DELETE", `/runners/${id}`)).status).toBe(204);
    expect((await call("GET", `/runners/${id}`)).status).toBe(404);
  });

  it("enforces the runner scopes", async () => {
    const reader = (await call("POST", "/api-keys", { name: "reader", permissions: ["read:runners"] })).body.value as string;
    expect((await call("GET", "/runners", undefined, reader)).status).toBe(200);
    expect((await call("POST", "/runners", { regionId: region, name: "runner-c" }, reader)).status).toBe(403);
    const writer = (await call("POST", "/api-keys", { name: "writer", permissions: ["write:runners"] })).body.value as string;
    const made = await call("POST", "/runners", { regionId: region, name: "runner-c" }, writer);
    expect(made.status).toBe(201);
    await call("PATCH", `/runners/${made.body.id}/scheduling`, { unschedulable: true }, writer);
    expect((await call("DELETE", `/runners/${made.body.id}`, undefined, writer)).status).toBe(403);
    expect((await call("DELETE", `/runners/${made.body.id}`)).status).toBe(204);
  });
});

describe.skipIf(!root)("health checks of a runner process", () => {
  let runner: RunnerProcess;
  afterAll(async () => {
    await runner?.stop();
  });

  it("is ready with its capacity once it answers, unresponsive after kill -9, ready again when it is back", async () => {
    const port = await freePort();
    const made = await call("POST", "/runners", { regionId: region, name: "live-1", apiUrl: `http://127.0.0.1:${port}` });
    expect(made.status).toBe(201);
    const id = made.body.id as string;
    const state = async () => (await call("GET", `/runners/${id}`)).body;
    // Not started yet: it stays initializing until unresponsiveMs has passed since its registration.
    expect((await state()).state).toBe("initializing");
    runner = await startRunnerProcess({ port, credential: made.body.apiKey });
    await eventually("the runner to be ready", async () => (await state()).state === "ready", 20_000);
    const ready = await state();
    expect(ready.cpu).toBeGreaterThan(0);
    expect(ready.memory).toBeGreaterThan(0);
    expect(ready.lastChecked).toBeTruthy();
    expect(ready.currentMemoryUsagePercentage).toBeGreaterThan(0);
    // 100 less its busiest resource (a loaded test machine may well be at 0).
    expect(ready.availabilityScore).toBe(Math.max(0, Math.round(100 - Math.max(ready.currentCpuUsagePercentage, ready.currentMemoryUsagePercentage, ready.currentDiskUsagePercentage))));
    await runner.kill();
    await eventually("the runner to be unresponsive", async () => (await state()).state === "unresponsive", 20_000);
    await runner.restart();
    await eventually("the runner to be ready again", async () => (await state()).state === "ready", 20_000);
  }, 90_000);

  it("a runner registers itself at its first start with a registration key, and only then", async () => {
    const key = (await call("POST", "/api-keys", { name: "runner-registration", permissions: ["write:runners"] })).body.value as string;
    const port = await freePort();
    const env = { SANDBAR_CONTROL_URL: t.url, SANDBAR_RUNNER_REGISTRATION_KEY: key, SANDBAR_RUNNER_REGION: "edge-1", SANDBAR_RUNNER_NAME: "self-1", SANDBAR_RUNNER_ADVERTISE_URL: `http://127.0.0.1:${port}` };
    const self = await startRunnerProcess({ port, credential: "", env });
    try {
      expect(self.output()).toContain("registered as runner");
      const mine = async () => (await call("GET", "/runners")).body.filter((r: { name: string }) => r.name === "self-1");
      expect(await mine()).toHaveLength(1);
      const id = (await mine())[0].id as string;
      await eventually("the runner to be ready", async () => (await call("GET", `/runners/${id}`)).body.state === "ready", 20_000);
      // Only the credential's hash is kept on the runner's host.
      const kept = await readFile(path.join(self.dataDir, "runner", "runner-credential.sha256"));
      expect(kept.toString()).toMatch(/^[0-9a-f]{64}\n$/);
      expect((await stat(path.join(self.dataDir, "runner", "runner-credential.sha256"))).mode & 0o777).toBe(0o600);
      await self.kill();
      await self.restart();
      expect(await mine()).toHaveLength(1);
      await eventually("the runner to be ready again", async () => (await call("GET", `/runners/${id}`)).body.state === "ready", 20_000);
    } finally {
      await self.stop();
    }
    // A key without write:runners: the runner says why and exits.
    const reader = (await call("POST", "/api-keys", { name: "runner-reader", permissions: ["read:runners"] })).body.value as string;
    await expect(startRunnerProcess({ credential: "", env: { ...env, SANDBAR_RUNNER_REGISTRATION_KEY: reader, SANDBAR_RUNNER_NAME: "self-2" } })).rejects.toThrow(/registering with .* failed: 403/);
  }, 90_000);

  it("a runner given another credential than the one registered never becomes ready", async () => {
    const port = await freePort();
    const made = await call("POST", "/runners", { regionId: region, name: "wrong-cred", apiUrl: `http://127.0.0.1:${port}` });
    const other = await startRunnerProcess({ port, credential: "sbrn_" + "0".repeat(64) });
    try {
      await eventually("the runner to be unresponsive", async () => (await call("GET", `/runners/${made.body.id}`)).body.state === "unresponsive", 20_000);
    } finally {
      await other.stop();
    }
  }, 60_000);
});
