import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle } from "../../../agent/src/testing/bundle.ts";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { pushTestImage, registryAccount } from "../snapshots/testing/image.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { reconcile } from "../sandboxes/reconcile.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, registerRunnerProcess } from "./testing/runner-process.ts";
import type { UntypedJson } from "../casts.ts";

// Snapshots from images and volumes on registered runners, all real: a docker-registry on
// loopback (basic auth) holding an image built here, one control server that pulls it as a
// snapshot, and two `sandbar runner` processes on loopback (the registry must be reachable from
// them) registered in one region. A create there makes the chosen runner pull the image
// (credentials passed per pull) before it boots the sandbox. Control and both runners share one
// volume root (a directory of this host standing in for an NFS mount).

const root = process.getuid?.() === 0;
const CHECKS = { intervalMs: 200, unresponsiveMs: 1500 };
let reg: TestRegistry;
let scratch: string;
let volumeRoot: string;
let bundle: string;
let app: string;
let t: TestServer;
let region: string;
const runners: Array<{ process: RunnerProcess; id: string; key: string; remote: RemoteRuntime }> = [];
const call = (method: string, p: string, body?: unknown) => api(t.url, t.adminKey, method, p, body);
const exec = async (id: string, command: string) => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body as { exitCode: number; result: string };

async function register(name: string, subnet: string) {
  const { process, id } = await registerRunnerProcess(call, { regionId: region, name, subnet, env: { SANDBAR_AGENT_BUNDLE: bundle, SANDBAR_VOLUME_ROOT: volumeRoot, SANDBAR_RUNNER_CPU: "2", SANDBAR_RUNNER_MEMORY_GIB: "4", SANDBAR_RUNNER_DISK_GIB: "20" } });
  const remote = await RemoteRuntime.open({ url: process.url, credential: process.credential });
  return { process, id, key: remote.runnerId, remote };
}

async function snapshotFrom(name: string, imageName: string): Promise<{ id: string; ref: string }> {
  const made = await call("POST", "/snapshots", { name, imageName });
  expect(made.status, JSON.stringify(made.body)).toBe(200);
  let row: UntypedJson;
  await eventually(`snapshot ${name} active`, async () => ["active", "error"].includes((row = (await call("GET", `/snapshots/${made.body.id}`)).body).state), 60_000);
  expect(row.errorReason ?? null).toBeNull();
  return { id: row.id, ref: row.ref };
}

beforeAll(async () => {
  if (!root) return;
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-runner-images-"));
  reg = await startRegistry();
  app = await pushTestImage(reg, scratch);
  bundle = await buildAgentBundle("sandbar-runner-images-agent-");
  volumeRoot = path.join(scratch, "shared-volumes");
  t = await startTestServer({ settings: { agentBundle: bundle, runnerChecks: CHECKS, volumeRoot }, control: { registryCredentials: registryAccount(reg) } });
  region = (await call("POST", "/regions", { name: "fleet" })).body.id;
  runners.push(await register("runner-a", "10.217.0.0/24"), await register("runner-b", "10.218.0.0/24"));
  for (const r of runners) await eventually(`${r.id} ready`, async () => (await call("GET", `/runners/${r.id}`)).body.state === "ready", 30_000);
}, 240_000);

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

describe.skipIf(!root)("snapshots from images on registered runners", () => {
  let snap: { id: string; ref: string };
  let first: { id: string; runnerId: string };

  it("a create in a runner region pulls the snapshot's image onto the chosen runner (pulling_snapshot meanwhile), then boots from it", async () => {
    snap = await snapshotFrom("app-snap", app);
    for (const r of runners) expect(await r.remote.holdsImage(snap.ref)).toBe(false);
    // The states the sandbox reads as while its create runs.
    const seen = new Set<string>();
    let creating = true;
    const watch = (async () => {
      while (creating) {
        for (const s of (await call("GET", "/sandbox")).body ?? []) seen.add(s.state);
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const r = await call("POST", "/sandbox", { target: "fleet", snapshot: "app-snap", autoStopInterval: 0 }).finally(() => (creating = false));
    await watch;
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.state).toBe("started");
    first = { id: r.body.id, runnerId: r.body.runnerId };
    expect(seen).toContain("pulling_snapshot");
    const holder = runners.find((x) => x.key === first.runnerId)!;
    const other = runners.find((x) => x.key !== first.runnerId)!;
    expect(await holder.remote.heldImages()).toContain(snap.ref);
    expect(await other.remote.holdsImage(snap.ref)).toBe(false);
    expect(await exec(first.id, "cat /app/hello.txt; echo $GREETING")).toMatchObject({ exitCode: 0, result: "hello from the image\nhello world\n" });
  }, 180_000);

  it("placement prefers a ready runner that already holds the image over more free CPU; a full holder gives way, and the other runner pulls", async () => {
    const holder = runners.find((x) => x.key === first.runnerId)!;
    const other = runners.find((x) => x.key !== first.runnerId)!;
    await eventually("the holder to report its image", async () => (await call("GET", `/runners/${holder.id}`)).body.currentSnapshotCount === 1, 10_000);
    // The holder has 1 CPU free, the other 2: the image wins.
    const second = await call("POST", "/sandbox", { target: "fleet", snapshot: "app-snap", autoStopInterval: 0 });
    expect(second.status, JSON.stringify(second.body)).toBe(200);
    expect(second.body.runnerId).toBe(holder.key);
    // The holder is full now (2 CPUs): the other runner takes the next one and pulls the image.
    const third = await call("POST", "/sandbox", { target: "fleet", snapshot: "app-snap", autoStopInterval: 0 });
    expect(third.status, JSON.stringify(third.body)).toBe(200);
    expect(third.body.runnerId).toBe(other.key);
    expect(await other.remote.holdsImage(snap.ref)).toBe(true);
    expect((await exec(third.body.id, "cat /app/hello.txt")).result).toBe("hello from the image\n");
    for (const id of [second.body.id, third.body.id]) expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
    for (const id of [second.body.id, third.body.id]) await eventually(`${id} gone`, async () => (await call("GET", `/sandbox/${id}`)).body.state === "destroyed", 30_000);
  }, 180_000);

  it("a create a crash left pulling_snapshot is made again by reconciliation (the runner pulls, the sandbox starts)", async () => {
    const r = await call("POST", "/sandbox", { target: "fleet", snapshot: "app-snap", autoStopInterval: 0 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const id = r.body.id as string;
    const { manager } = t.server.sandboxes;
    const runner = runners.find((x) => x.key === r.body.runnerId)!;
    // What a control process killed during the runner's pull leaves: the row pulling, the sandbox
    // not made, the image not on the runner.
    await runner.remote.destroy(id);
    await runner.remote.removeImage(snap.ref);
    await manager.store.update(id, { state: "pulling_snapshot" });
    expect((await call("GET", `/sandbox/${id}`)).body.state).toBe("pulling_snapshot");
    const report = await reconcile(manager, undefined, { runtime: runner.remote, runnerId: runner.key });
    expect(report.resumed).toContain(id);
    expect((await call("GET", `/sandbox/${id}`)).body.state).toBe("started");
    expect(await runner.remote.holdsImage(snap.ref)).toBe(true);
    expect((await exec(id, "cat /app/hello.txt")).result).toBe("hello from the image\n");
    expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
    await eventually(`${id} gone`, async () => (await call("GET", `/sandbox/${id}`)).body.state === "destroyed", 30_000);
  }, 120_000);

  it("two pulls of one image on a runner at once are one pull", async () => {
    const name = await pushTestImage(reg, await mkdtemp(path.join(scratch, "twice-")), "test/twice:1.0", { files: { "twice.txt": "2\n" } });
    const head = await fetch(`http://${reg.host}/v2/test/twice/manifests/1.0`, {
      method: "HEAD",
      headers: { accept: "application/vnd.oci.image.manifest.v1+json", authorization: `Basic ${Buffer.from(`${reg.username}:${reg.password}`).toString("base64")}` },
    });
    const digest = head.headers.get("docker-content-digest")!;
    expect(digest).toMatch(/^sha256:[a-f0-9]{64}$/);
    const credentials = { username: reg.username, password: reg.password };
    const logs: string[][] = [[], []];
    const r = runners[0]!.remote;
    await Promise.all(logs.map((log) => r.pullImage(digest, name, credentials, (l) => log.push(l))));
    expect(await r.holdsImage(digest)).toBe(true);
    // One of the two did the work (its lines say so); the other waited for it and got its result.
    expect(logs.flat().filter((l) => l.startsWith("pulling "))).toHaveLength(1);
    await r.removeImage(digest);
  }, 120_000);

  it("the runner's snapshot service refuses what is wrong, naming the field, and checks the pulled digest", async () => {
    const r = runners[0]!.remote;
    const code = (p: Promise<unknown>) => p.then(() => undefined, (err: unknown) => (err instanceof ConnectError ? [err.code, err.rawMessage] : err));
    expect(await code(r.pullImage("latest", app))).toEqual([Code.InvalidArgument, "ref must be an image manifest digest (sha256:<64 hex>)"]);
    expect(await code(r.pullImage(snap.ref, ""))).toEqual([Code.InvalidArgument, "image is required"]);
    const wrong = `sha256:${"0".repeat(64)}`;
    const credentials = { username: reg.username, password: reg.password };
    expect(await code(r.pullImage(wrong, app, credentials))).toEqual([Code.FailedPrecondition, `${app} is ${snap.ref} on its registry, not ${wrong}`]);
    // Without the registry's credentials the pull is refused by the registry.
    const fresh = await pushTestImage(reg, await mkdtemp(path.join(scratch, "other-")), "test/other:1.0", { files: { "other.txt": "x\n" } });
    const denied = await code(r.pullImage(wrong, fresh));
    expect(Array.isArray(denied) && denied[0]).toBe(Code.PermissionDenied);
  }, 120_000);

  it("a runner refuses to remove an image one of its sandboxes boots from, and removes it once unused", async () => {
    const holder = runners.find((x) => x.key === first.runnerId)!.remote;
    const refused = await holder.removeImage(snap.ref).then(() => undefined, (err: unknown) => err as ConnectError);
    expect(refused?.code).toBe(Code.FailedPrecondition);
    expect(refused?.rawMessage).toBe(`Snapshot ${snap.ref} is in use by sandbox ${first.id} on this runner`);
    expect(await holder.holdsImage(snap.ref)).toBe(true);
    expect((await call("DELETE", `/sandbox/${first.id}`)).status).toBeLessThan(300);
    await eventually("the sandbox gone", async () => (await call("GET", `/sandbox/${first.id}`)).body.state === "destroyed", 30_000);
    await holder.removeImage(snap.ref);
    expect(await holder.holdsImage(snap.ref)).toBe(false);
    await holder.removeImage(snap.ref); // an absent ref is not an error
  }, 120_000);

  it("an archived image sandbox starts again on a runner that no longer holds the image: the runner pulls it before the restore, files kept", async () => {
    const r = await call("POST", "/sandbox", { target: "fleet", snapshot: "app-snap", autoStopInterval: 0 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const id = r.body.id as string;
    await exec(id, "echo kept > /tmp/marker");
    const state = async () => (await call("GET", `/sandbox/${id}`)).body;
    const stopped = await call("POST", `/sandbox/${id}/stop`);
    expect(stopped.status, JSON.stringify(stopped.body)).toBeLessThan(300);
    await eventually("stopped", async () => (await state()).state === "stopped", 30_000);
    const archiveped = await call("POST", `/sandbox/${id}/archive`);
    expect(archiveped.status, JSON.stringify(archiveped.body)).toBeLessThan(300);
    await eventually("archived", async () => (await state()).state === "archived", 60_000);
    // No runner holds the image any more.
    for (const x of runners) await x.remote.removeImage(snap.ref);
    const startped = await call("POST", `/sandbox/${id}/start`);
    expect(startped.status, JSON.stringify(startped.body)).toBeLessThan(300);
    await eventually("started", async () => (await state()).state === "started", 60_000);
    const on = (await state()).runnerId as string;
    const now = runners.find((x) => x.key === on)!;
    expect(await now.remote.holdsImage(snap.ref)).toBe(true);
    expect((await exec(id, "cat /tmp/marker /app/hello.txt")).result).toBe("kept\nhello from the image\n");
    expect((await call("DELETE", `/sandbox/${id}`)).status).toBeLessThan(300);
    await eventually(`${id} gone`, async () => (await state()).state === "destroyed", 30_000);
  }, 180_000);
});

describe.skipIf(!root)("deleting a snapshot", () => {
  it("removes its image from the runners that hold it once no sandbox and no other snapshot uses it", async () => {
    const { ref } = await snapshotFrom("gone-snap", app);
    const made = await call("POST", "/sandbox", { target: "fleet", snapshot: "gone-snap", autoStopInterval: 0 });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const holding = async () => (await Promise.all(runners.map(async (r) => ((await r.remote.holdsImage(ref)) ? r.key : undefined)))).filter((k) => k !== undefined);
    expect(await holding()).toContain(made.body.runnerId);
    // In use by a sandbox: refused, images kept.
    const refused = await call("DELETE", "/snapshots/gone-snap");
    expect(refused.status).toBe(409);
    expect(refused.body.message).toContain("in use");
    expect((await call("DELETE", `/sandbox/${made.body.id}`)).status).toBeLessThan(300);
    await eventually("the sandbox gone", async () => (await call("GET", `/sandbox/${made.body.id}`)).body.state === "destroyed", 30_000);
    // app-snap (the same image) still names it: the runners keep it.
    expect((await call("DELETE", "/snapshots/gone-snap")).status).toBeLessThan(300);
    expect(await holding()).toContain(made.body.runnerId);
    expect((await call("DELETE", "/snapshots/app-snap")).status).toBeLessThan(300);
    expect(await holding()).toEqual([]);
    for (const r of runners) await eventually(`${r.id} to report no image`, async () => (await call("GET", `/runners/${r.id}`)).body.currentSnapshotCount === 0, 10_000);
  }, 180_000);
});

describe.skipIf(!root)("volumes on registered runners", () => {
  it("a volume is shared live between sandboxes on two runners (the shared volume root)", async () => {
    const vol = await call("POST", "/volumes", { name: "fleet-data" });
    expect(vol.status, JSON.stringify(vol.body)).toBe(200);
    await eventually("the volume ready", async () => (await call("GET", `/volumes/${vol.body.id}`)).body.state === "ready", 10_000);
    const body = { target: "fleet", cpu: 1, memory: 1, disk: 3, autoStopInterval: 0, volumes: [{ volumeId: "fleet-data", mountPath: "/data" }] };
    const a = await call("POST", "/sandbox", body);
    expect(a.status, JSON.stringify(a.body)).toBe(200);
    const b = await call("POST", "/sandbox", body);
    expect(b.status, JSON.stringify(b.body)).toBe(200);
    expect(new Set([a.body.runnerId, b.body.runnerId])).toEqual(new Set(runners.map((r) => r.key)));
    expect(await exec(a.body.id, "echo from-a > /data/note && cat /data/note")).toMatchObject({ exitCode: 0, result: "from-a\n" });
    expect(await exec(b.body.id, "cat /data/note && echo from-b >> /data/note")).toMatchObject({ exitCode: 0, result: "from-a\n" });
    expect((await exec(a.body.id, "cat /data/note")).result).toBe("from-a\nfrom-b\n");
    // The bytes are in the shared root, under the volume's id.
    expect(await readFile(path.join(volumeRoot, vol.body.id, "note"), "utf8")).toBe("from-a\nfrom-b\n");
    for (const s of [a, b]) expect((await call("DELETE", `/sandbox/${s.body.id}`)).status).toBeLessThan(300);
  }, 180_000);
});
