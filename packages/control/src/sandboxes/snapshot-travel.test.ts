import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle } from "../../../agent/src/testing/bundle.ts";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import type { UntypedJson } from "../casts.ts";
import { type RunnerProcess, registerRunnerProcess } from "../runners/testing/runner-process.ts";
import { pushTestImage, registryAccount } from "../snapshots/testing/image.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "./testing/fixtures.ts";

// Snapshots of a running sandbox that travel (DESIGN.md decision 19), all real: a control server
// with its internal registry, an image snapshot from a registry of its own, and a `sandbar runner`
// process in region "fleet". A snapshot's layers are exported in the background to the internal
// registry as an OCI image (the base image's two layers plus two captured ones, a whiteout and an
// opaque directory in the top one); a create that cannot use the layers (removed from their host, or their
// runner gone) pulls the image and has the files and the deletions. Run as root.

const root = process.getuid?.() === 0;
const CHECKS = { intervalMs: 200, unresponsiveMs: 1500 };
const MB10 = randomBytes(10 * 1024 * 1024);
let reg: TestRegistry;
let scratch: string;
let bundle: string;
let t: TestServer;
let org: string;
let runner: { process: RunnerProcess; id: string };
const call = (method: string, p: string, body?: unknown) => api(t.url, t.adminKey, method, p, body);
const exec = async (id: string, command: string) => (await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body as { exitCode: number; result: string };
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

async function upload(id: string, file: string, data: Uint8Array): Promise<void> {
  const form = new FormData();
  form.append("file", new Blob([data]), path.basename(file));
  const up = await fetch(`${t.url}/api/toolbox/${id}/toolbox/files/upload?path=${encodeURIComponent(file)}`, { method: "POST", body: form, headers: { authorization: `Bearer ${t.adminKey}` } });
  expect(up.status, await up.clone().text()).toBe(200);
}

async function download(id: string, file: string): Promise<Uint8Array> {
  const down = await fetch(`${t.url}/api/toolbox/${id}/toolbox/files/download?path=${encodeURIComponent(file)}`, { headers: { authorization: `Bearer ${t.adminKey}` } });
  expect(down.status).toBe(200);
  return new Uint8Array(await down.arrayBuffer());
}

/**
 * A stack of two captures whose top deletes what the one below holds: a sandbox (user root, on
 * `target`) writes files and is snapshotted; a sandbox made from that snapshot deletes a file (a
 * whiteout), replaces a directory (opaque) and writes 10 MB, and is snapshotted as `name`. (The
 * base image's files are root's on the host, which the sandbox cannot delete; its own it can.)
 */
async function stackOfTwo(name: string, target?: string): Promise<UntypedJson[]> {
  const first = await call("POST", "/sandbox", { ...(target ? { target } : {}), snapshot: "travel-base", user: "root", autoStopInterval: 0 });
  expect(first.status, JSON.stringify(first.body)).toBe(200);
  for (const f of ["/root/keep.txt", "/root/gone.txt", "/root/dir/old.txt"]) await upload(first.body.id, f, Buffer.from(`${f}\n`));
  expect((await call("POST", `/sandbox/${first.body.id}/snapshot`, { name: `${name}-below` })).status).toBe(200);
  const second = await call("POST", "/sandbox", { snapshot: `${name}-below`, user: "root", autoStopInterval: 0 });
  expect(second.status, JSON.stringify(second.body)).toBe(200);
  const id = second.body.id;
  expect((await call("DELETE", `/toolbox/${id}/toolbox/files?path=/root/gone.txt`)).status).toBe(200);
  expect((await call("DELETE", `/toolbox/${id}/toolbox/files?path=/root/dir&recursive=true`)).status).toBe(200);
  await upload(id, "/root/dir/new.txt", Buffer.from("made here\n"));
  await upload(id, "/root/big.bin", MB10);
  const r = await call("POST", `/sandbox/${id}/snapshot`, { name });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return [first.body, second.body];
}

/** What a sandbox made from the travelled image must hold. */
async function expectChanged(id: string): Promise<void> {
  expect(await exec(id, "cat /root/keep.txt /root/dir/new.txt")).toMatchObject({ exitCode: 0, result: "/root/keep.txt\nmade here\n" });
  expect((await exec(id, "cat /root/gone.txt")).exitCode).not.toBe(0);
  expect((await exec(id, "cat /root/dir/old.txt")).exitCode).not.toBe(0);
  expect(sha(await download(id, "/root/big.bin"))).toBe(sha(MB10));
}

/** The exported image as the pulling host's store unpacked it: the base's two layers and the two captured, whiteouts and the opaque directory in the top one. */
async function expectImage(digest: string): Promise<void> {
  const image = await (await t.server.sandboxes.runtime.images!()).get(digest);
  expect(image?.layers).toHaveLength(4);
  expect(image!.layers[3]).toMatchObject({ whiteouts: ["root/gone.txt"], opaque: ["root/dir"] });
}

/** The snapshot's row once its export settled (pushed or failed). */
async function exported(name: string) {
  const t0 = Date.now();
  let row = await t.server.sandboxes.snapshots.store.find(org, name);
  await eventually(`snapshot ${name} exported`, async () => {
    row = await t.server.sandboxes.snapshots.store.find(org, name);
    return row.pushedImage !== null || row.pushError !== null;
  }, 120_000);
  console.info(`snapshot ${name}: exported and pushed within ${Date.now() - t0} ms of its answer`);
  expect(row.pushError).toBeNull();
  expect(row.pushedImage).toMatch(/^127\.0\.0\.1:\d+\/.+\/sandbar-snapshot-[0-9a-f-]+@sha256:[0-9a-f]{64}$/);
  return row;
}

beforeAll(async () => {
  if (!root) return;
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-travel-"));
  reg = await startRegistry();
  const base = await pushTestImage(reg, scratch, "travel/base:1.0");
  bundle = await buildAgentBundle("sandbar-travel-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle, runnerChecks: CHECKS, internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } }, control: { registryCredentials: registryAccount(reg) } });
  org = (await call("GET", "/organizations")).body[0].id;
  const region = (await call("POST", "/regions", { name: "fleet" })).body.id;
  runner = await registerRunnerProcess(call, { regionId: region, name: "runner-a", subnet: "10.223.0.0/24", env: { SANDBAR_AGENT_BUNDLE: bundle, SANDBAR_RUNNER_CPU: "4", SANDBAR_RUNNER_MEMORY_GIB: "8", SANDBAR_RUNNER_DISK_GIB: "20" } });
  await eventually("runner-a ready", async () => (await call("GET", `/runners/${runner.id}`)).body.state === "ready", 30_000);
  const snap = await call("POST", "/snapshots", { name: "travel-base", imageName: base });
  expect(snap.status, JSON.stringify(snap.body)).toBe(200);
  await eventually("travel-base active", async () => (await call("GET", "/snapshots/travel-base")).body.state === "active", 120_000);
}, 300_000);

afterAll(async () => {
  if (t) for (const s of (await call("GET", "/sandbox")).body ?? []) await call("DELETE", `/sandbox/${s.id}`);
  await t?.stop();
  await runner?.process.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
  if (bundle) await rm(bundle, { recursive: true, force: true });
}, 120_000);

describe.skipIf(!root)("snapshots of a running sandbox travel as OCI images", () => {
  it("on this server's runtime: exported in the background; with its layers removed, a create pulls the image (4 layers, a whiteout, an opaque dir) and has the files and deletions", async () => {
    const rt = t.server.sandboxes.runtime;
    const [first, parent] = await stackOfTwo("travel-local");
    await exported("travel-local-below");
    const row = await exported("travel-local");
    expect(row.runnerId).toBe(rt.runnerId);
    const digest = row.pushedImage!.split("@")[1]!;

    // While its layers are here, creates use them (nothing pulled).
    const onLayers = await call("POST", "/sandbox", { snapshot: "travel-local", user: "root", autoStopInterval: 0 });
    expect(onLayers.status, JSON.stringify(onLayers.body)).toBe(200);
    expect((await t.server.sandboxes.manager.store.byId(onLayers.body.id))?.layers).toEqual(row.layers);
    expect(await (await rt.images!()).get(digest)).toBeUndefined();
    expect((await call("DELETE", `/sandbox/${onLayers.body.id}`)).status).toBe(200);

    // The figure for a 10 MB change: an export again, its base's blobs cached by the first.
    const m = t.server.sandboxes.manager;
    const base = (await m.store.byId(parent.id))!.imageRef!;
    const t0 = Date.now();
    const again = await rt.exportLayers!({ layers: row.layers!, image: base, user: "root", push: await m.snapshotPush!(org, "figure") });
    console.info(`export of a 10 MB change with the base cached: ${Date.now() - t0} ms (${again.layers} layers, ${again.bytes} bytes)`);
    expect(again.layers).toBe(4);

    // The layers gone from the host (no sandbox on them any more): the create pulls the image from the internal registry.
    expect((await call("DELETE", `/sandbox/${parent.id}`)).status).toBe(200);
    for (const id of [onLayers.body.id, parent.id]) await eventually("the sandboxes on the layers destroyed", async () => (await m.store.byId(id))?.state === "destroyed", 60_000);
    await rt.removeLayers(row.layers!);
    const fromImage = await call("POST", "/sandbox", { snapshot: "travel-local", user: "root", autoStopInterval: 0 });
    expect(fromImage.status, JSON.stringify(fromImage.body)).toBe(200);
    expect(fromImage.body.state).toBe("started");
    const rec = await t.server.sandboxes.manager.store.byId(fromImage.body.id);
    expect(rec).toMatchObject({ imageRef: digest, layers: null });
    await expectImage(digest);
    await expectChanged(fromImage.body.id);
    expect((await call("DELETE", `/sandbox/${first.id}`)).status).toBe(200);
  }, 300_000);

  it("of a default-snapshot sandbox: the default root is one layer, compressed once per runner; with the layers removed, a create from the image has the files", async () => {
    const rt = t.server.sandboxes.runtime;
    const m = t.server.sandboxes.manager;
    const made = await call("POST", "/sandbox", { autoStopInterval: 0 });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    await upload(made.body.id, "/home/sandbar/note.txt", Buffer.from("on the default root\n"));
    await upload(made.body.id, "/home/sandbar/big.bin", MB10);
    expect((await call("POST", `/sandbox/${made.body.id}/snapshot`, { name: "travel-default" })).status).toBe(200);
    const row = await exported("travel-default");
    const cache = path.join((await rt.images!()).root, "exports");
    const cached = (await readdir(cache)).filter((n) => n.startsWith("default-"));
    expect(cached).toHaveLength(1);
    // A second snapshot of it: the default root's blob comes from the cache.
    await upload(made.body.id, "/home/sandbar/more.txt", Buffer.from("more\n"));
    expect((await call("POST", `/sandbox/${made.body.id}/snapshot`, { name: "travel-default-2" })).status).toBe(200);
    await exported("travel-default-2");
    expect((await readdir(cache)).filter((n) => n.startsWith("default-"))).toEqual(cached);

    expect((await call("DELETE", `/sandbox/${made.body.id}`)).status).toBe(200);
    await eventually("destroyed", async () => (await m.store.byId(made.body.id))?.state === "destroyed", 60_000);
    await rt.removeLayers(row.layers!);
    const fromImage = await call("POST", "/sandbox", { snapshot: "travel-default", autoStopInterval: 0 });
    expect(fromImage.status, JSON.stringify(fromImage.body)).toBe(200);
    expect(fromImage.body.state).toBe("started");
    const digest = row.pushedImage!.split("@")[1]!;
    expect((await m.store.byId(fromImage.body.id))?.imageRef).toBe(digest);
    expect((await (await rt.images!()).get(digest))?.layers).toHaveLength(2);
    expect(await exec(fromImage.body.id, "cat ~/note.txt && python3 -c 'print(6*7)'")).toMatchObject({ exitCode: 0, result: "on the default root\n42\n" });
    expect(sha(await download(fromImage.body.id, "/home/sandbar/big.bin"))).toBe(sha(MB10));
  }, 300_000);

  it("on a registered runner: the runner exports and pushes; with that runner gone, this server's runtime pulls the image and has the files and deletions", async () => {
    const [first, parent] = await stackOfTwo("travel-remote", "fleet");
    expect(parent.runnerId).not.toBe(t.server.sandboxes.runtime.runnerId);
    expect(parent.runnerId).toBe(first.runnerId);
    await exported("travel-remote-below");
    const row = await exported("travel-remote");
    expect(row.runnerId).toBe(parent.runnerId);
    const digest = row.pushedImage!.split("@")[1]!;

    // Its runner answering, a create is made there on the layers.
    const there = await call("POST", "/sandbox", { snapshot: "travel-remote", user: "root", autoStopInterval: 0 });
    expect(there.status, JSON.stringify(there.body)).toBe(200);
    expect(there.body.runnerId).toBe(parent.runnerId);
    expect((await call("DELETE", `/sandbox/${there.body.id}`)).status).toBe(200);

    // The runner gone (its sandboxes deleted first): the snapshot is an image snapshot pulled where the create is placed.
    for (const s of [first, parent]) expect((await call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
    for (const s of [first, parent, there.body]) await eventually("runner-a's sandboxes destroyed", async () => (await t.server.sandboxes.manager.store.byId(s.id))?.state === "destroyed", 60_000);
    await runner.process.stop();
    await eventually("runner-a unresponsive", async () => !(await t.server.sandboxes.manager.runners!.ready()).includes(parent.runnerId), 30_000);
    const moved = await call("POST", "/sandbox", { snapshot: "travel-remote", user: "root", autoStopInterval: 0 });
    expect(moved.status, JSON.stringify(moved.body)).toBe(200);
    expect(moved.body).toMatchObject({ state: "started", runnerId: t.server.sandboxes.runtime.runnerId });
    expect((await t.server.sandboxes.manager.store.byId(moved.body.id))?.imageRef).toBe(digest);
    await expectImage(digest);
    await expectChanged(moved.body.id);
  }, 300_000);
});
