import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../packages/control/src/snapshots/testing/image.ts";
import { eventually } from "../../packages/control/src/sandboxes/testing/fixtures.ts";
import { load, saveRegistry, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's `daytona.warmPool` (POST/GET /warm-pools, PATCH/DELETE /warm-pools/{id}) against a
// real server, with a pool of an image snapshot (not the default one) on real sandboxes: creates
// of that snapshot claim the pool's sandboxes (warmPoolId on the DTO), the pool refills, shrinks
// and is removed with its unclaimed sandboxes; pool sandboxes are in no list until claimed.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let reg: TestRegistry;
let scratch: string;
let daytona: import("sdk-0218").Daytona;

const rest = async (method: string, path: string, body?: unknown) => {
  const r = await fetch(`${s.apiUrl}${path}`, { method, headers: { authorization: `Bearer ${s.adminKey}`, "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : undefined };
};
/** Sandboxes on the host: pool members included, rows or not. */
const onHost = async () => new Set((await s.server.server.sandboxes.runtime.list()).map((x) => x.id));

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "sandbar-sdk218-pool-"));
  reg = await startRegistry();
  const image = await pushTestImage(reg, scratch, "sdk/pool:1.0");
  s = await startRealServer();
  await saveRegistry(s, reg);
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
  await daytona.snapshot.create({ name: "pool-snap", image }, { timeout: 120 });
}, 600_000);

afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

it("keeps a pool of an image snapshot filled; a create of that snapshot claims one, and the pool refills", async () => {
  const pool = await daytona.warmPool.create({ snapshot: "pool-snap", pool: 2 });
  expect(pool).toMatchObject({ snapshot: "pool-snap", pool: 2, target: "local", osUser: expect.any(String), cpu: expect.any(Number), mem: expect.any(Number), disk: expect.any(Number) });
  await eventually("the pool to fill", async () => (await daytona.warmPool.list()).find((p) => p.id === pool.id)?.currentSize === 2, 120_000);

  // Pool sandboxes are on the host but in no list.
  const before = await onHost();
  const listed = new Set(((await rest("GET", "/sandbox")).body as Array<{ id: string }>).map((x) => x.id));
  const pooledIds = [...before].filter((id) => !listed.has(id));
  expect(pooledIds.length).toBeGreaterThanOrEqual(2);

  const sandbox = await daytona.create({ snapshot: "pool-snap", envVars: { WHO: "claimer" }, labels: { team: "pool" } }, { timeout: 60 });
  expect(before.has(sandbox.id)).toBe(true); // it was running before the request
  expect((await rest("GET", `/sandbox/${sandbox.id}`)).body).toMatchObject({ warmPoolId: pool.id, snapshot: "pool-snap", labels: { team: "pool" }, state: "started" });
  const r = await sandbox.process.executeCommand('cat /app/hello.txt; echo "$WHO"');
  expect(r.result).toBe("hello from the image\nclaimer\n");

  await eventually("the pool to refill", async () => (await daytona.warmPool.list()).find((p) => p.id === pool.id)?.currentSize === 2, 120_000);
  // A create of the default snapshot is not served by this pool.
  const other = await daytona.create({}, { timeout: 60 });
  expect((await rest("GET", `/sandbox/${other.id}`)).body.warmPoolId ?? null).toBeNull();
  await other.delete();
  await sandbox.delete();

  const shrunk = await daytona.warmPool.update(pool.id, { pool: 1 });
  expect(shrunk.pool).toBe(1);
  expect(shrunk.currentSize).toBeLessThanOrEqual(1);
  const kept = await onHost();
  await daytona.warmPool.delete(pool.id);
  expect((await daytona.warmPool.list()).map((p) => p.id)).not.toContain(pool.id);
  // Its unclaimed sandbox is gone from the host.
  const after = await onHost();
  expect([...kept].filter((id) => pooledIds.includes(id) && after.has(id))).toEqual([]);
}, 300_000);

it("keeps the members of a paused pool frozen until a claim thaws one (no CPU while they wait)", async () => {
  const made = await rest("POST", "/warm-pools", { snapshot: "pool-snap", pool: 1, paused: true });
  expect(made.body).toMatchObject({ paused: true, pool: 1 });
  await eventually("the pool to fill", async () => (await rest("GET", `/warm-pools/${made.body.id}`)).body.currentSize === 1, 120_000);
  const runtime = s.server.server.sandboxes.runtime;
  const listed = new Set(((await rest("GET", "/sandbox")).body as Array<{ id: string }>).map((x) => x.id));
  const member = (await runtime.list()).find((x) => !listed.has(x.id) && x.state === "paused");
  expect(member, "a paused pool member on the host").toBeDefined();
  const sandbox = await daytona.create({ snapshot: "pool-snap", envVars: { WHO: "thawed" } }, { timeout: 60 });
  expect(sandbox.id).toBe(member!.id);
  expect((await runtime.inspect(sandbox.id))?.state).toBe("started");
  expect((await sandbox.process.executeCommand('echo "$WHO"')).result).toBe("thawed\n");
  await sandbox.delete();
  expect((await rest("DELETE", `/warm-pools/${made.body.id}`)).status).toBe(200);
}, 300_000);

it("refuses bad pools with clear 4xx answers", async () => {
  expect((await rest("POST", "/warm-pools", { snapshot: "no-such-snapshot", pool: 1 })).status).toBe(400);
  expect((await rest("POST", "/warm-pools", { snapshot: "pool-snap", pool: -1 })).body.message).toMatch(/pool must be an integer from 0 to/);
  expect((await rest("POST", "/warm-pools", { snapshot: "pool-snap", pool: 1000 })).status).toBe(400);
  expect((await rest("POST", "/warm-pools", { snapshot: "", pool: 1 })).body.message).toMatch(/snapshot should not be empty/);
  const made = await rest("POST", "/warm-pools", { snapshot: "pool-snap", pool: 0 });
  expect(made.status).toBe(200);
  expect((await rest("POST", "/warm-pools", { snapshot: "pool-snap", pool: 0 })).status).toBe(409);
  expect((await rest("PATCH", `/warm-pools/${made.body.id}`, { pool: 11 })).status).toBe(400);
  expect((await rest("GET", "/warm-pools/not-a-uuid")).status).toBe(404);
  expect((await rest("DELETE", `/warm-pools/${made.body.id}`)).status).toBe(200);
  expect((await rest("GET", `/warm-pools/${made.body.id}`)).status).toBe(404);
});
