import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, registerRunnerProcess } from "./testing/runner-process.ts";
import { createTestNetns, type TestNetns } from "./testing/netns.ts";
import type { UntypedJson } from "../casts.ts";

// Scheduling across registered runners, all real: two `sandbar runner` processes, each in a
// network namespace the test makes (reached over a veth pair at its own address; own data dir,
// port, uid range and sandbox subnet), each offering 2 CPUs, 4 GiB and 20 GiB;
// two control processes on one PostgreSQL. Sandboxes of 1 CPU, 1 GiB, 3 GiB: four fit in all.

const root = process.getuid?.() === 0;
/** Sandboxes a ready runner holds unknown to the database are removed after 3 s. */
const STRAY_GRACE_MS = 3000;
const CHECKS = { intervalMs: 200, unresponsiveMs: 1500, strayGraceMs: STRAY_GRACE_MS };
/** A timer "minute" of one second: auto-stop is seen within the test. */
const TIMERS = { timerMinuteMs: 1000, timerTickMs: 250 };
let t: TestServer;
let t2: TestServer;
let region: string;
const runners: Array<{ process: RunnerProcess; id: string; key: string }> = [];
/** Sandboxes made by the tests and the runner each landed on. */
const created = new Map<string, string>();
const namespaces: TestNetns[] = [];
const call = (method: string, path: string, body?: unknown, server = t) => api(server.url, server.adminKey, method, path, body);

/** A runner process in a network namespace of its own, reached at its address there. */
async function register(name: string, subnet: string, index: number): Promise<{ process: RunnerProcess; id: string; key: string }> {
  const netns = createTestNetns(index);
  namespaces.push(netns);
  const { process, id } = await registerRunnerProcess(call, { regionId: region, name, subnet, netns, env: { SANDBAR_RUNNER_CPU: "2", SANDBAR_RUNNER_MEMORY_GIB: "4", SANDBAR_RUNNER_DISK_GIB: "20" } });
  const remote = await RemoteRuntime.open({ url: process.url, credential: process.credential });
  const key = remote.runnerId;
  await remote.close();
  return { process, id, key };
}

const runnerState = async (id: string) => (await call("GET", `/runners/${id}`)).body;

async function create(server = t): Promise<{ status: number; body: UntypedJson }> {
  const r = await call("POST", "/sandbox", { target: "fleet", cpu: 1, memory: 1, disk: 3, autoStopInterval: 0 }, server);
  if (r.status === 200) created.set(r.body.id, r.body.runnerId);
  return r;
}

const exec = async (id: string, command: string) => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body;

async function deleteAll(): Promise<void> {
  for (const id of [...created.keys()]) {
    await call("DELETE", `/sandbox/${id}`);
    created.delete(id);
  }
}

beforeAll(async () => {
  if (!root) return;
  t = await startTestServer({ settings: { runnerChecks: CHECKS, ...TIMERS } });
  t2 = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey, settings: { runnerChecks: CHECKS, ...TIMERS } });
  region = (await call("POST", "/regions", { name: "fleet" })).body.id;
  runners.push(await register("runner-a", "10.214.0.0/24", 1), await register("runner-b", "10.215.0.0/24", 2));
  for (const r of runners) await eventually(`${r.id} to be ready`, async () => (await runnerState(r.id)).state === "ready", 30_000);
}, 180_000);

afterAll(async () => {
  if (t) await deleteAll().catch(() => undefined);
  await t2?.stop();
  await t?.stop();
  for (const r of runners) await r.process.stop();
  for (const n of namespaces) n.remove();
}, 120_000);

describe.skipIf(!root)("scheduling across runner processes", () => {
  it("two control processes creating at once never over-commit: four sandboxes fit, two per runner, the rest is refused", async () => {
    const answers = await Promise.all([create(t), create(t2), create(t), create(t2), create(t), create(t2)]);
    const ok = answers.filter((a) => a.status === 200);
    const refused = answers.filter((a) => a.status !== 200);
    expect(ok).toHaveLength(4);
    for (const r of refused) expect(r.body.message).toBe("No available runners");
    const perRunner = new Map<string, number>();
    for (const a of ok) perRunner.set(a.body.runnerId, (perRunner.get(a.body.runnerId) ?? 0) + 1);
    expect(Object.fromEntries(perRunner)).toEqual({ [runners[0]!.key]: 2, [runners[1]!.key]: 2 });
    for (const r of runners) expect(await runnerState(r.id)).toMatchObject({ cpu: 2, memory: 4, disk: 20, currentAllocatedCpu: 2, currentAllocatedMemoryGiB: 2, currentAllocatedDiskGiB: 6 });
    // The toolbox reaches a sandbox on each runner.
    for (const a of ok) expect(await exec(a.body.id, "echo on $(cat /proc/sys/kernel/hostname 2>/dev/null || echo box)")).toMatchObject({ exitCode: 0 });
    await deleteAll();
  }, 240_000);

  it("refuses volumes in a region whose runners have no shared volume root, saying so", async () => {
    const vol = await call("POST", "/volumes", { name: "fleet-data" });
    const r = await call("POST", "/sandbox", { target: "fleet", volumes: [{ volumeId: vol.body.id, mountPath: "/data" }] });
    expect(r.status).toBe(400);
    expect(r.body.message).toBe("Volumes cannot be mounted in this region: none of its runners has a shared volume root (SANDBAR_VOLUME_ROOT)");
  });

  it("spreads new sandboxes over the runners by free capacity", async () => {
    const a = await create();
    const b = await create();
    expect(a.status, JSON.stringify(a.body)).toBe(200);
    expect(b.status, JSON.stringify(b.body)).toBe(200);
    expect(new Set([a.body.runnerId, b.body.runnerId])).toEqual(new Set(runners.map((r) => r.key)));
  }, 120_000);

  it("a draining runner takes no new sandboxes; its sandboxes keep running", async () => {
    const [ra, rb] = runners;
    expect((await call("PATCH", `/runners/${ra!.id}/draining`, { draining: true })).body.draining).toBe(true);
    const onA = [...created].find(([, runner]) => runner === ra!.key)![0];
    const next = await create();
    expect(next.status, JSON.stringify(next.body)).toBe(200);
    expect(next.body.runnerId).toBe(rb!.key);
    // runner-b is full now (2 CPUs), runner-a draining: nothing more fits.
    const refused = await create();
    expect(refused.status).toBe(400);
    expect(refused.body.message).toBe("No available runners");
    expect((await exec(onA, "echo alive")).result).toBe("alive\n");
    await call("PATCH", `/runners/${ra!.id}/draining`, { draining: false });
    const again = await create();
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    expect(again.body.runnerId).toBe(ra!.key);
  }, 180_000);

  it("auto-stops an idle sandbox on a registered runner (the timers cover registered runners)", async () => {
    await deleteAll();
    const r = await call("POST", "/sandbox", { target: "fleet", cpu: 1, memory: 1, disk: 3, autoStopInterval: 1 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    created.set(r.body.id, r.body.runnerId);
    expect(runners.map((x) => x.key)).toContain(r.body.runnerId);
    await eventually("the idle sandbox to stop", async () => (await call("GET", `/sandbox/${r.body.id}`)).body.state === "stopped", 20_000);
  }, 60_000);

  it("archives a sandbox of a runner to control and restores it onto a runner, files kept", async () => {
    await deleteAll();
    const r = await create();
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const id = r.body.id as string;
    await exec(id, "echo archived-and-back > ~/marker");
    const state = async () => (await call("GET", `/sandbox/${id}`)).body;
    expect((await call("POST", `/sandbox/${id}/stop`)).status).toBeLessThan(300);
    await eventually("stopped", async () => (await state()).state === "stopped", 30_000);
    expect((await call("POST", `/sandbox/${id}/archive`)).status).toBeLessThan(300);
    await eventually("archived", async () => (await state()).state === "archived", 60_000);
    expect((await state()).runnerId ?? null).toBeNull();
    expect((await call("POST", `/sandbox/${id}/start`)).status).toBeLessThan(300);
    await eventually("started", async () => (await state()).state === "started", 60_000);
    expect(runners.map((x) => x.key)).toContain((await state()).runnerId);
    expect((await exec(id, "cat ~/marker")).result).toBe("archived-and-back\n");
  }, 180_000);

  it("a control process that starts reconciles the registered runners: what a runner holds unknown to the database is removed", async () => {
    const [ra] = runners;
    const remote = await RemoteRuntime.open({ url: ra!.process.url, credential: ra!.process.credential });
    const stray = randomUUID();
    try {
      await remote.create({ id: stray, cpu: 1, memoryGiB: 1, diskGiB: 1, env: {}, user: "sandbar" });
      expect(await remote.inspect(stray)).toMatchObject({ state: "started" });
      await t2.stop();
      t2 = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey, settings: { runnerChecks: CHECKS, ...TIMERS } });
      expect(await remote.inspect(stray)).toBeUndefined();
      // What the database knows stays as it was.
      for (const id of created.keys()) expect((await call("GET", `/sandbox/${id}`)).body.state).toBe("started");
    } finally {
      await remote.destroy(stray);
      await remote.close();
    }
  }, 120_000);

  it("kill -9 of a runner: unresponsive, no new sandboxes on it; back, its sandboxes answer again", async () => {
    await deleteAll();
    const [ra, rb] = runners;
    const a = await create();
    const b = await create();
    const onB = [a, b].find((x) => x.body.runnerId === rb!.key)!.body.id as string;
    await exec(onB, "echo kept > ~/marker");
    await rb!.process.kill();
    await eventually("runner-b to be unresponsive", async () => (await runnerState(rb!.id)).state === "unresponsive", 20_000);
    const down = await call("POST", `/toolbox/${onB}/toolbox/process/execute`, { command: "true" });
    expect(down.status).toBeGreaterThanOrEqual(500);
    // Reported unknown while its runner is silent, in reads and lists; the row keeps what it was.
    await eventually("its sandbox to read unknown", async () => (await call("GET", `/sandbox/${onB}`)).body.state === "unknown", 5000);
    expect((await call("GET", "/sandbox")).body.find((x: { id: string }) => x.id === onB).state).toBe("unknown");
    // Only runner-a is scheduled: it has room for one more, then nothing.
    const c = await create();
    expect(c.body.runnerId).toBe(ra!.key);
    expect((await create()).body.message).toBe("No available runners");
    await rb!.process.restart();
    await eventually("runner-b to be ready", async () => (await runnerState(rb!.id)).state === "ready", 20_000);
    expect((await call("GET", `/sandbox/${onB}`)).body.state).toBe("started");
    await eventually("its sandbox to answer again", async () => (await exec(onB, "cat ~/marker"))?.result === "kept\n", 20_000);
  }, 180_000);

  it("a runner back from kill -9 holding a sandbox the database does not know: kept for the grace period, then removed by the health loop; what the database knows stays", async () => {
    await deleteAll();
    const [, rb] = runners;
    const a = await create();
    const b = await create();
    const onB = [a, b].find((x) => x.body.runnerId === rb!.key)!.body.id as string;
    const stray = randomUUID();
    const before = await RemoteRuntime.open({ url: rb!.process.url, credential: rb!.process.credential });
    await before.create({ id: stray, cpu: 1, memoryGiB: 1, diskGiB: 1, env: {}, user: "sandbar" });
    await before.close();
    await rb!.process.kill();
    await eventually("runner-b to be unresponsive", async () => (await runnerState(rb!.id)).state === "unresponsive", 20_000);
    // The grace counts from when control first sees the stray on the answering runner: after this.
    // (A lower bound only: however slowly the test sees things, it cannot see the removal early.)
    const back = Date.now();
    await rb!.process.restart();
    await eventually("runner-b to be ready", async () => (await runnerState(rb!.id)).state === "ready", 20_000);
    const remote = await RemoteRuntime.open({ url: rb!.process.url, credential: rb!.process.credential });
    try {
      await eventually("the stray sandbox removed", async () => (await remote.inspect(stray)) === undefined, 20_000);
      const waited = Date.now() - back;
      // Not before the grace period (less one check interval: a sweep may have begun just before).
      expect(waited).toBeGreaterThanOrEqual(STRAY_GRACE_MS - CHECKS.intervalMs);
      expect(await remote.inspect(onB)).toMatchObject({ state: "started" });
      await eventually("the known sandbox answers", async () => (await exec(onB, "echo still"))?.result === "still\n", 20_000);
    } finally {
      await remote.destroy(stray);
      await remote.close();
    }
  }, 180_000);
});
