import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle } from "../../../agent/src/testing/bundle.ts";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import { RemoteRuntime } from "../runners/remote-runtime.ts";
import { type RunnerProcess, registerRunnerProcess } from "../runners/testing/runner-process.ts";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { pushTestImage, registryAccount } from "../snapshots/testing/image.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { Builder } from "./builder.ts";
import { uploadSleepContext } from "./testing/contexts.ts";
import type { UntypedJson } from "../casts.ts";

// Declarative builds in a fleet, all real: a control server with its internal registry (Debian's
// docker-registry on loopback) and object storage, a registry holding the FROM image (basic auth),
// and two `sandbar runner` processes registered in one region. The runner picked builds with
// buildah (the context streamed to it by control), pushes the image to the internal registry, and
// boots a sandbox from it; with that runner draining, the other one pulls the image from the
// internal registry (pull-only account) and boots it too. Run as root.

const root = process.getuid?.() === 0;
const CHECKS = { intervalMs: 200, unresponsiveMs: 1500 };
let reg: TestRegistry;
let scratch: string;
let bundle: string;
let base: string;
let t: TestServer;
let region: string;
let org: string;
const runners: Array<{ process: RunnerProcess; id: string; key: string; remote: RemoteRuntime }> = [];
const call = (method: string, p: string, body?: unknown) => api(t.url, t.adminKey, method, p, body);
const exec = async (id: string, command: string) => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body as { exitCode: number; result: string };
const dockerfile = (run: string) => `FROM ${base}\nCOPY /bin/sleep /bin/sleep\nRUN ${run}\n`;

async function register(name: string, subnet: string) {
  const { process, id } = await registerRunnerProcess(call, { regionId: region, name, subnet, env: { SANDBAR_AGENT_BUNDLE: bundle, SANDBAR_RUNNER_CPU: "4", SANDBAR_RUNNER_MEMORY_GIB: "8", SANDBAR_RUNNER_DISK_GIB: "20" } });
  const remote = await RemoteRuntime.open({ url: process.url, credential: process.credential });
  return { process, id, key: remote.runnerId, remote };
}

async function settled(id: string): Promise<UntypedJson> {
  let row: UntypedJson;
  await eventually(`snapshot ${id} built`, async () => !["pending", "building"].includes((row = (await call("GET", `/snapshots/${id}`)).body).state), 240_000);
  return row;
}

beforeAll(async () => {
  if (!root) return;
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-fleet-builds-"));
  reg = await startRegistry();
  base = await pushTestImage(reg, scratch, "fleet/base:1.0");
  bundle = await buildAgentBundle("sandbar-fleet-builds-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle, runnerChecks: CHECKS, internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } }, control: { registryCredentials: registryAccount(reg) } });
  region = (await call("POST", "/regions", { name: "fleet" })).body.id;
  org = (await call("GET", "/organizations")).body[0].id;
  runners.push(await register("runner-a", "10.221.0.0/24"), await register("runner-b", "10.222.0.0/24"));
  for (const r of runners) await eventually(`${r.id} ready`, async () => (await call("GET", `/runners/${r.id}`)).body.state === "ready", 30_000);
  await uploadSleepContext(call, scratch);
}, 300_000);

afterAll(async () => {
  if (t) for (const s of (await call("GET", "/sandbox")).body ?? []) await call("DELETE", `/sandbox/${s.id}`);
  await t?.stop();
  for (const r of runners) {
    await r.remote.close();
    await r.process.stop();
  }
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
  if (bundle) await rm(bundle, { recursive: true, force: true });
}, 120_000);

describe.skipIf(!root)("declarative builds on registered runners", () => {
  let snap: UntypedJson;
  let builder: (typeof runners)[number];
  let other: (typeof runners)[number];

  it("a runner builds the snapshot while control follows its log live; the image is recorded as the runner's and pushed to the internal registry", async () => {
    const made = await call("POST", "/snapshots", { name: "fleet-built", regionId: "fleet", buildInfo: { dockerfileContent: dockerfile("echo start && sleep 4 && echo slept > /slept.txt && echo done-sleeping"), contextHashes: ["sleepctx"] } });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    // Followed through control while the runner builds: "start" arrives while the snapshot still builds.
    const res = await fetch(`${t.url}/api/snapshots/${made.body.id}/build-logs?follow=true`, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(res.status).toBe(200);
    let text = "";
    let stateAtStart: string | undefined;
    const decoder = new TextDecoder();
    for await (const chunk of res.body!) {
      text += decoder.decode(chunk, { stream: true });
      if (stateAtStart === undefined && /^start$/m.test(text)) stateAtStart = (await call("GET", `/snapshots/${made.body.id}`)).body.state;
    }
    expect(stateAtStart).toBe("building");
    expect(text).toMatch(/^building on runner /m);
    expect(text).toMatch(/^done-sleeping$/m);
    expect(text).toMatch(/^pushed to 127\.0\.0\.1:\d+\/.*daytona-[0-9a-f]{64}:daytona in \d+ ms$/m);
    // Figures for the record: buildah's time and the push's, as the runner logged them.
    console.info([/^built in \d+ ms$/m.exec(text)?.[0], /^pushed to .* in \d+ ms$/m.exec(text)?.[0]].join("; "));
    snap = await settled(made.body.id);
    expect(snap).toMatchObject({ state: "active", errorReason: null });
    expect(snap.ref).toMatch(/^sha256:[0-9a-f]{64}$/);
    const on = /^building on runner (\S+)$/m.exec(text)![1];
    builder = runners.find((r) => r.key === on)!;
    other = runners.find((r) => r.key !== on)!;
    expect(builder).toBeDefined();
    expect(await builder.remote.holdsImage(snap.ref)).toBe(true);
    expect(await other.remote.holdsImage(snap.ref)).toBe(false);
    // Control's own host never built it.
    expect(await (await t.server.sandboxes.runtime.images!()).get(snap.ref)).toBeUndefined();
    // The runner's own log of the build (GetSnapshotLogs), by its build key.
    let runnerLog = "";
    for await (const c of builder.remote.snapshotLogs(Builder.key(org, snap.buildInfo), false, AbortSignal.timeout(10_000))) runnerLog += Buffer.from(c.data).toString();
    expect(runnerLog).toMatch(/^start$/m);
  }, 300_000);

  it("a sandbox from the built snapshot boots on the runner that built it", async () => {
    const r = await call("POST", "/sandbox", { target: "fleet", snapshot: "fleet-built", autoStopInterval: 0 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ state: "started", runnerId: builder.key });
    expect(await exec(r.body.id, "cat /slept.txt /app/hello.txt")).toMatchObject({ exitCode: 0, result: "slept\nhello from the image\n" });
  }, 180_000);

  it("with that runner draining, the other runner pulls the image from the internal registry and boots it", async () => {
    expect((await call("PATCH", `/runners/${builder.id}/draining`, { draining: true })).status).toBe(200);
    const r = await call("POST", "/sandbox", { target: "fleet", snapshot: "fleet-built", autoStopInterval: 0 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ state: "started", runnerId: other.key });
    expect(await other.remote.holdsImage(snap.ref)).toBe(true);
    expect(await exec(r.body.id, "cat /slept.txt")).toMatchObject({ exitCode: 0, result: "slept\n" });
    expect((await call("PATCH", `/runners/${builder.id}/draining`, { draining: false })).status).toBe(200);
  }, 180_000);

  it("control's own runtime (the shared region) pulls the built image from the internal registry too", async () => {
    const r = await call("POST", "/sandbox", { snapshot: "fleet-built", autoStopInterval: 0 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ state: "started", runnerId: t.server.sandboxes.runtime.runnerId });
    expect(await (await t.server.sandboxes.runtime.images!()).get(snap.ref)).toBeDefined();
    expect(await exec(r.body.id, "cat /slept.txt")).toMatchObject({ exitCode: 0, result: "slept\n" });
  }, 180_000);

  it("two snapshots of one build made at once build it once", async () => {
    const buildInfo = { dockerfileContent: dockerfile("echo twice-asked && sleep 2 && echo once > /once.txt"), contextHashes: ["sleepctx"] };
    const [a, b] = await Promise.all(["twin-a", "twin-b"].map((name) => call("POST", "/snapshots", { name, regionId: "fleet", buildInfo })));
    expect([a.status, b.status]).toEqual([200, 200]);
    const [ra, rb] = await Promise.all([settled(a.body.id), settled(b.body.id)]);
    expect([ra.state, rb.state]).toEqual(["active", "active"]);
    expect(ra.ref).toBe(rb.ref);
    const logs = await Promise.all([a, b].map((x) => fetch(`${t.url}/api/snapshots/${x.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } }).then((r) => r.text())));
    // One log ran buildah's RUN; the other joined it.
    expect(logs.filter((l) => /^twice-asked$/m.test(l) && !l.includes("joining the running build")).length).toBe(1);
    expect(logs.filter((l) => l.includes("joining the running build")).length).toBe(1);
  }, 240_000);

  it("a failing RUN ends build_failed with buildah's last lines, in the reason and the log", async () => {
    const made = await call("POST", "/snapshots", { name: "fleet-broken", regionId: "fleet", buildInfo: { dockerfileContent: dockerfile("echo about-to-fail && exit 3"), contextHashes: ["sleepctx"] } });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const row = await settled(made.body.id);
    expect(row.state).toBe("build_failed");
    expect(row.errorReason).toMatch(/about-to-fail/);
    expect(row.errorReason).toMatch(/exit status 3|exited with 3|error building/i);
    const logs = await fetch(`${t.url}/api/snapshots/${made.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } }).then((x) => x.text());
    expect(logs).toMatch(/^about-to-fail$/m);
    expect(logs).toMatch(/^error: /m);
  }, 240_000);

  it("a sandbox created with buildInfo in the fleet is placed, built on its runner and started there", async () => {
    const r = await call("POST", "/sandbox", { target: "fleet", autoStopInterval: 0, buildInfo: { dockerfileContent: dockerfile("echo sandbox-build > /made.txt"), contextHashes: ["sleepctx"] } });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.state).toBe("pending_build");
    const placedOn = r.body.runnerId as string;
    expect(runners.map((x) => x.key)).toContain(placedOn);
    let row: UntypedJson;
    await eventually("the sandbox built and started", async () => ["started", "build_failed", "error"].includes((row = (await call("GET", `/sandbox/${r.body.id}`)).body).state), 240_000);
    expect(row).toMatchObject({ state: "started", runnerId: placedOn });
    const logs = await fetch(`${t.url}/api/sandbox/${r.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } }).then((x) => x.text());
    expect(logs).toContain(`building on runner ${placedOn}`);
    // The row reads started a moment before its create lets go of the sandbox (409 meanwhile).
    let out: { exitCode: number; result: string } | undefined;
    await eventually("the toolbox", async () => (out = await exec(r.body.id, "cat /made.txt")).exitCode !== undefined, 10_000);
    expect(out).toMatchObject({ exitCode: 0, result: "sandbox-build\n" });
  }, 300_000);

  it("another control process on the same database follows a build it did not dispatch live, from the building runner", async () => {
    const t2 = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey, settings: { agentBundle: bundle, runnerChecks: CHECKS } });
    try {
      const made = await call("POST", "/snapshots", { name: "followed-elsewhere", regionId: "fleet", buildInfo: { dockerfileContent: dockerfile("echo elsewhere-start && sleep 4 && echo elsewhere-end"), contextHashes: ["sleepctx"] } });
      expect(made.status, JSON.stringify(made.body)).toBe(200);
      await eventually("the build's runner recorded", async () => (await t.server.sandboxes.snapshots.store.byId(made.body.id))?.buildInfo?.runnerId !== undefined, 60_000);
      const res = await fetch(`${t2.url}/api/snapshots/${made.body.id}/build-logs?follow=true`, { headers: { authorization: `Bearer ${t.adminKey}` } });
      expect(res.status).toBe(200);
      let text = "";
      let stateAtStart: string | undefined;
      const decoder = new TextDecoder();
      for await (const chunk of res.body!) {
        text += decoder.decode(chunk, { stream: true });
        if (stateAtStart === undefined && /^elsewhere-start$/m.test(text)) stateAtStart = (await api(t2.url, t.adminKey, "GET", `/snapshots/${made.body.id}`)).body.state;
      }
      expect(stateAtStart).toBe("building");
      expect(text).toMatch(/^elsewhere-end$/m);
      expect(text).toMatch(/^image sha256:[0-9a-f]{64} ready/m);
      expect((await settled(made.body.id)).state).toBe("active");

      // A sandbox's build, the same way: its runner keeps the log.
      const sbx = await call("POST", "/sandbox", { target: "fleet", autoStopInterval: 0, buildInfo: { dockerfileContent: dockerfile("echo sbx-elsewhere-start && sleep 4 && echo sbx-elsewhere-end"), contextHashes: ["sleepctx"] } });
      expect(sbx.status, JSON.stringify(sbx.body)).toBe(200);
      await eventually("the sandbox building", async () => (await call("GET", `/sandbox/${sbx.body.id}`)).body.state === "building_snapshot", 30_000);
      // The runner's log starts once the build reaches it.
      let seen = "";
      await eventually("the runner's log", async () => {
        seen = await fetch(`${t2.url}/api/sandbox/${sbx.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } }).then((r) => r.text());
        return seen !== "";
      }, 60_000);
      const followed = await fetch(`${t2.url}/api/sandbox/${sbx.body.id}/build-logs?follow=true`, { headers: { authorization: `Bearer ${t.adminKey}` } }).then((r) => r.text());
      expect(followed).toMatch(/^sbx-elsewhere-start$/m);
      expect(followed).toMatch(/^sbx-elsewhere-end$/m);
      await eventually("the sandbox started", async () => (await call("GET", `/sandbox/${sbx.body.id}`)).body.state === "started", 60_000);
    } finally {
      await t2.stop();
    }
  }, 240_000);
});
