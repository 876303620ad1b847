import { expect, it } from "vitest";
import { EndpointCache } from "./endpoint-cache.ts";
import { unixAgentDial } from "./runtime.ts";

// The toolbox's lookup cache on its own (the manager's use of it, evicted by the store's writes,
// is covered by the toolbox and lifecycle suites against a real database).

const ep = (sandboxId: string) => ({ sandboxId, ...unixAgentDial(`/run/${sandboxId}.sock`, "s") });

it("answers a lookup by id and by name until the sandbox is written, then neither", () => {
  const c = new EndpointCache();
  c.set("org", "id-1", ep("id-1"), c.generation());
  c.set("org", "my-box", ep("id-1"), c.generation());
  expect(c.get("org", "id-1")?.key).toBe("/run/id-1.sock");
  expect(c.get("org", "my-box")?.sandboxId).toBe("id-1");
  expect(c.get("other-org", "id-1")).toBeUndefined();
  c.evict("id-1");
  expect(c.get("org", "id-1")).toBeUndefined();
  expect(c.get("org", "my-box")).toBeUndefined();
});

it("drops the answer of a lookup that a write overtook", () => {
  const c = new EndpointCache();
  const since = c.generation();
  c.evict("id-1"); // the row changed while the lookup read it
  c.set("org", "id-1", ep("id-1"), since);
  expect(c.get("org", "id-1")).toBeUndefined();
});

it("expires entries after its time to live", () => {
  const c = new EndpointCache(1000);
  c.set("org", "id-1", ep("id-1"), c.generation(), 10_000);
  expect(c.get("org", "id-1", 10_999)).toBeDefined();
  expect(c.get("org", "id-1", 11_001)).toBeUndefined();
});
