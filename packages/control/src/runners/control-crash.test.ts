import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, TEST_SNAPSHOT_CACHE, type TestServer } from "../testing/server.ts";
import { freePort } from "@sandbar/runner/free-port";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { ClusterLocks } from "../sandboxes/cluster-locks.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, startRunnerProcess } from "./testing/runner-process.ts";
import { createTestNetns, type TestNetns } from "./testing/netns.ts";

// kill -9 of a control replica in the middle of a create, all real: a `sandbar serve` process
// (the replica that dies) and an in-process control server (the one that stays) on one
// PostgreSQL, one `sandbar runner` process in a network namespace of its own. The replica is
// killed the moment its row is in the database, while the runner is still making the sandbox;
// the surviving replica must finish the create on its own (no restart of anything), leave one
// sandbox on the runner, and count it once against the runner's capacity.

const root = process.getuid?.() === 0;
const CLI = fileURLToPath(new URL("../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
const CHECKS = { intervalMs: 200, unresponsiveMs: 3000 };
let t: TestServer;
let region: string;
let runner: RunnerProcess;
let netns: TestNetns;
let runnerKey: string;
let runnerRowId: string;
const call = (method: string, p: string, body?: unknown, base = t.url) => api(base, t.adminKey, method, p, body);

/** A `sandbar serve` process on the test server's database. */
async function startControlProcess(): Promise<{ url: string; child: ChildProcess; kill(): Promise<void>; dataDir: string }> {
  const dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-control-process-"));
  const port = await freePort();
  const child = spawn(process.execPath, [CLI, "serve"], {
    cwd: REPO,
    env: {
      ...process.env,
      DATABASE_URL: t.server.databaseUrl,
      SANDBAR_BOOTSTRAP_API_KEY: t.adminKey,
      SANDBAR_DATA_DIR: dataDir,
      SANDBAR_HOST: "127.0.0.1",
      SANDBAR_PORT: String(port),
      SANDBAR_PUBLIC_URL: `http://127.0.0.1:${port}`,
      SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
      SANDBAR_WARM_POOL: "0",
      SANDBAR_INTERNAL_REGISTRY: "off",
      SANDBAR_SANDBOX_SUBNET: "10.218.0.0/24",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (c: Buffer) => {
      out += c.toString();
      if (out.includes("listening on ")) resolve();
    });
    child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
    child.once("exit", (code) => reject(new Error(`the control process exited (${code}):\n${out}`)));
  });
  return {
    url: `http://127.0.0.1:${port}`,
    child,
    dataDir,
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((r) => child.once("exit", () => r()));
      child.kill("SIGKILL");
      await exited;
    },
  };
}

beforeAll(async () => {
  if (!root) return;
  t = await startTestServer({ settings: { runnerChecks: CHECKS, timerTickMs: 250 } });
  region = (await call("POST", "/regions", { name: "fleet" })).body.id;
  netns = createTestNetns(3);
  const port = await freePort();
  const made = await call("POST", "/runners", { regionId: region, name: "runner-a", apiUrl: `http://${netns.address}:${port}` });
  expect(made.status, JSON.stringify(made.body)).toBe(201);
  runnerRowId = made.body.id;
  runner = await startRunnerProcess({ port, credential: made.body.apiKey, subnet: "10.219.0.0/24", netns, env: { SANDBAR_RUNNER_CPU: "2", SANDBAR_RUNNER_MEMORY_GIB: "4", SANDBAR_RUNNER_DISK_GIB: "20" } });
  const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
  runnerKey = remote.runnerId;
  await remote.close();
  await eventually("the runner to be ready", async () => (await call("GET", `/runners/${made.body.id}`)).body.state === "ready", 30_000);
}, 180_000);

afterAll(async () => {
  if (t) for (const s of (await call("GET", "/sandbox")).body ?? []) await call("DELETE", `/sandbox/${s.id}`).catch(() => undefined);
  await t?.stop();
  await runner?.stop();
  netns?.remove();
}, 120_000);

describe.skipIf(!root)("kill -9 of a control replica mid-create", () => {
  it("the other replica finishes the create: one sandbox on the runner, started, counted once, given back on delete", async () => {
    const db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    const doomed = await startControlProcess();
    try {
      // What the sandboxes take of the runner, from their rows (what placement counts against it).
      const cpuUsed = async () => (await call("GET", `/runners/${runnerRowId}`)).body.currentAllocatedCpu ?? 0;
      expect(await cpuUsed()).toBe(0);
      // The create, sent to the replica that dies; its answer never comes.
      const answer = call("POST", "/sandbox", { target: "fleet", cpu: 1, memory: 1, disk: 3, autoStopInterval: 0 }, doomed.url).catch((err: unknown) => err);
      // Killed as soon as its row is in the database (inserted, placed on the runner, not yet started).
      let id: string | undefined;
      const seen = Date.now();
      while (!id && Date.now() - seen < 30_000) {
        const { rows } = await db.query<{ id: string; state: string }>(`select id, state from sandbox where region_id = $1 and state <> 'destroyed'`, [region]);
        if (rows[0]) {
          await doomed.kill();
          id = rows[0].id;
          expect(rows[0].state).toBe("unknown"); // caught before the sandbox started
        } else await new Promise((r) => setTimeout(r, 5));
      }
      expect(id).toBeDefined();
      await answer;
      // The survivor finishes it, with no restart of anything.
      await eventually("the surviving replica to finish the create", async () => (await call("GET", `/sandbox/${id}`)).body.state === "started", 60_000);
      expect((await call("GET", `/sandbox/${id}`)).body.runnerId).toBe(runnerKey);
      const run = await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command: "echo finished" });
      expect(run.body).toMatchObject({ exitCode: 0, result: "finished\n" });
      // Exactly one sandbox on the runner, and it is this one.
      const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
      try {
        expect((await remote.list()).map((s) => s.id)).toEqual([id]);
      } finally {
        await remote.close();
      }
      expect(await cpuUsed()).toBe(1);
      expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
      await eventually("the quota to be given back", async () => (await cpuUsed()) === 0, 30_000);
    } finally {
      await doomed.kill();
      await rm(doomed.dataDir, { recursive: true, force: true });
      await db.end();
    }
  }, 180_000);

  it("an operation another live process holds is left alone (and refused with 409) until its lock goes; then it is finished", async () => {
    const made = await call("POST", "/sandbox", { target: "fleet", cpu: 1, memory: 1, disk: 3, autoStopInterval: 0 });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const id = made.body.id as string;
    // Another control process, alive, in the middle of stopping it: its row says so and it holds the lock.
    const other = new ClusterLocks(t.server.databaseUrl);
    const db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    try {
      expect(await other.acquire(id)).toBe(true);
      await db.query(`update sandbox set desired_state = 'stopped' where id = $1`, [id]);
      const { recovery } = t.server.sandboxes;
      expect(await recovery.pass()).toEqual([]);
      expect((await call("GET", `/sandbox/${id}`)).body.state).toBe("stopping");
      const busy = await call("POST", `/sandbox/${id}/start`);
      expect(busy.status).toBe(409);
      expect(busy.body.message).toBe("Sandbox state change in progress");
      const remote = await RemoteRuntime.open({ url: runner.url, credential: runner.credential });
      try {
        expect((await remote.inspect(id))?.state).toBe("started"); // untouched
        // The holder dies (its connection ends without a release): the next pass (this server's
        // own, every tick) finishes the stop.
        await other.close();
        await eventually("the stop to be finished", async () => (await call("GET", `/sandbox/${id}`)).body.state === "stopped", 10_000);
        expect((await remote.inspect(id))?.state).toBe("stopped");
      } finally {
        await remote.close();
      }
      expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
    } finally {
      await other.close();
      await db.end();
    }
  }, 120_000);

  it("a live replica's operation is never taken: its lock holds until its connection goes, then is free at once", async () => {
    const a = new ClusterLocks(t.server.databaseUrl);
    const b = new ClusterLocks(t.server.databaseUrl);
    try {
      const id = crypto.randomUUID();
      expect(await a.acquire(id)).toBe(true);
      expect(await b.acquire(id)).toBe(false);
      expect(await a.acquire(crypto.randomUUID())).toBe(true); // other sandboxes are not held
      await a.release(id);
      expect(await b.acquire(id)).toBe(true);
      expect(await a.acquire(id)).toBe(false);
      // A process that dies: its connection ends without a release, and the lock goes with it.
      await b.close();
      await eventually("the dead holder's lock to be free", async () => a.acquire(id), 5000);
    } finally {
      await a.close();
      await b.close();
    }
  });
});
