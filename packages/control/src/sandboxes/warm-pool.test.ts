import { rm } from "node:fs/promises";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";

// The warm pool on real sandboxes running the real agent: claims take over pool sandboxes with
// the request's identity and nothing of another request's, the pool refills, and pool sandboxes
// are in no list and no quota until claimed.

let bundle: string;
let f: SandboxFixture;
const POOL = 2;

beforeAll(async () => {
  bundle = await buildAgentBundle();
  f = await sandboxFixture({ agentBundle: bundle, warmPool: POOL });
  await eventually("the pool is full", async () => f.manager.pools!.default!.stats().ready === POOL, 60_000);
});

afterAll(async () => {
  await f?.stop();
  await rm(bundle, { recursive: true, force: true });
});

const execute = async (id: string, command: string) => (await f.call("POST", `/toolbox/${id}/toolbox/process/execute`, { command })).body as { exitCode: number; result: string };

it("keeps pool sandboxes out of lists and quotas until claimed", async () => {
  const pooled = (await f.runtime.list()).map((s) => s.id);
  expect(pooled.length).toBeGreaterThanOrEqual(POOL);
  const listed = (await f.call("GET", "/sandbox")).body as Array<{ id: string }>;
  expect(listed.filter((s) => pooled.includes(s.id))).toEqual([]);
  const org = (await f.call("GET", "/organizations")).body[0].id;
  const usage = (await f.call("GET", `/organizations/${org}/usage`)).body;
  expect(usage.regionUsage[0]).toMatchObject({ currentCpuUsage: 0, currentMemoryUsage: 0, currentDiskUsage: 0 });
});

it("hands each create its own sandbox with its env, labels and user, none of another's, and refills", async () => {
  const before = new Set((await f.runtime.list()).map((s) => s.id));
  const a = await f.create({ env: { WHO: "a", ONLY_A: "1" }, labels: { owner: "a" } });
  const b = await f.create({ env: { WHO: "b" }, labels: { owner: "b" } });
  // Both came from the pool: they were running on the host before the requests.
  expect(before.has(a.id) && before.has(b.id)).toBe(true);
  expect(a.state).toBe("started");
  expect(a.labels).toEqual({ owner: "a" });
  expect(b.labels).toEqual({ owner: "b" });
  // The first calls find the agent without a lookup (the claim knew it from the warm-up), and
  // write no activity stamp (the claim's row has a fresh one).
  const lookups = vi.spyOn(f.manager.store, "find");
  const stamps = vi.spyOn(f.manager.store, "touch");
  expect((await execute(a.id, 'echo "$WHO ${ONLY_A:-none}" && id -un')).result).toBe("a 1\nsandbar\n");
  expect((await execute(b.id, 'echo "$WHO ${ONLY_A:-none}" && id -un')).result).toBe("b none\nsandbar\n");
  expect(lookups.mock.calls.filter(([, idOrName]) => idOrName === a.id || idOrName === b.id)).toEqual([]);
  expect(stamps.mock.calls.filter(([id]) => id === a.id || id === b.id)).toEqual([]);
  lookups.mockRestore();
  stamps.mockRestore();
  // Sessions and later processes see it too, and it survives a stop and start (the host record has it).
  expect((await f.call("POST", `/sandbox/${a.id}/stop`)).body.state).toBe("stopped");
  expect((await f.call("POST", `/sandbox/${a.id}/start`)).body.state).toBe("started");
  expect((await execute(a.id, 'echo "$WHO"')).result).toBe("a\n");

  await eventually("the pool refills", async () => f.manager.pools!.default!.stats().ready === POOL, 60_000);
  const org = (await f.call("GET", "/organizations")).body[0].id;
  const usage = (await f.call("GET", `/organizations/${org}/usage`)).body.regionUsage[0];
  expect(usage).toMatchObject({ currentCpuUsage: 2, currentMemoryUsage: 2, currentDiskUsage: 6 });
  for (const s of [a, b]) expect((await f.call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
});

it("makes a sandbox of another shape the ordinary way, and gives back a claim whose request fails", async () => {
  const before = new Set((await f.runtime.list()).map((s) => s.id));
  const big = await f.create({ cpu: 2 });
  expect(before.has(big.id)).toBe(false);
  // Its agent is dialled while the answer goes out: the first call needs no lookup, and writes
  // no activity stamp (the create's is fresh).
  await eventually("its agent dialled", () => f.manager.endpoints.get(f.orgId, big.id) !== undefined);
  const lookups = vi.spyOn(f.manager.store, "find");
  const stamps = vi.spyOn(f.manager.store, "touch");
  expect((await execute(big.id, "echo made")).result).toBe("made\n");
  expect(lookups.mock.calls.filter(([, idOrName]) => idOrName === big.id)).toEqual([]);
  expect(stamps.mock.calls.filter(([id]) => id === big.id)).toEqual([]);
  lookups.mockRestore();
  stamps.mockRestore();
  const named = await f.create({ name: "taken" });
  const ready = f.manager.pools!.default!.stats().ready;
  const again = await f.call("POST", "/sandbox", { name: "taken" });
  expect(again.status).toBe(409);
  expect(f.manager.pools!.default!.stats().ready).toBe(ready); // the claimed sandbox went back
  for (const s of [big, named]) expect((await f.call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
});
