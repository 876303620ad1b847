/**
 * Rate limits against a real control server (embedded PostgreSQL, real sockets) with small
 * limits and a short window: each counter's last allowed call, the call past it (429 with the
 * reference's body and headers), the other counters untouched, and the reset after the window.
 * Callers are signed-in people, each with an organization of their own, and loopback addresses
 * of their own (127.0.0.x), so the counters of one test are not another's.
 */
import { randomUUID } from "node:crypto";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { Daytona, DaytonaRateLimitError } from "sdk-0218";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { startTestServer, type TestServer } from "../testing/server.ts";
import type { RateLimitSettings } from "./settings.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { callFrom, figures, sleep, type Answer } from "./test-client.ts";

const WINDOW = 3;
const LIMITS = { anonymous: 3, authenticated: 4, "sandbox-create": 2, "sandbox-lifecycle": 3, "failed-auth": 3 };
const settings = (store: RateLimitSettings["store"]): { rateLimits: RateLimitSettings } => ({ rateLimits: { store, windowSeconds: WINDOW, limits: LIMITS } });

/** The reference's 429 body for a path. */
function expectThrottled(a: Answer, path: string) {
  expect(a.status).toBe(429);
  expect(a.body).toEqual({ path: `/api${path}`, timestamp: expect.any(String), statusCode: 429, error: "Too Many Requests", message: "ThrottlerException: Too Many Requests" });
  expect(new Date(a.body.timestamp).toISOString()).toBe(a.body.timestamp);
}

const idp = new TestIssuer();
let t: TestServer;

beforeAll(async () => {
  await idp.start();
  await idp.addKey("k");
});
afterAll(() => idp.stop());

/** A signed-in person owning an organization of their own: the JWT and the header that selects it. */
async function person(name: string, server: TestServer = t) {
  const jwt = await idp.sign("k", { sub: `ext|${name}`, email: `${name}@example.test`, email_verified: true, name });
  const made = await callFrom("127.0.0.1", server.url, "POST", "/organizations", { token: jwt, body: { name: `${name} inc`, defaultRegionId: "local" } });
  expect(made.status).toBe(201);
  const org = made.body.id as string;
  return { jwt, org, headers: { "x-sandbar-organization-id": org } };
}

describe("rate limits (memory store)", () => {
  beforeAll(async () => {
    t = await startTestServer({ settings: { ...issuerSettings(idp), ...settings("memory") } });
  }, 120_000);
  afterAll(async () => {
    await t?.stop();
  });

  it("authenticated: figures on each call, 429 past the limit, creation/lifecycle/anonymous untouched, reset after the window", async () => {
    const p = await person("auth");
    const from = "127.0.0.2";
    const as = { token: p.jwt, headers: p.headers };
    for (let i = 1; i <= LIMITS.authenticated; i++) {
      const a = await callFrom(from, t.url, "GET", "/sandbox", as);
      expect(a.status).toBe(200);
      const f = figures(a, "authenticated");
      expect(f).toMatchObject({ limit: 4, remaining: 4 - i, counterLimit: 4, counterRemaining: 4 - i });
      expect(f.reset).toBeGreaterThanOrEqual(1);
      expect(f.reset).toBeLessThanOrEqual(WINDOW);
      expect(f.counterReset).toBe(f.reset);
      expect(f.retryAfter).toBeUndefined();
    }
    const over = await callFrom(from, t.url, "GET", "/sandbox?labels=%7B%7D", as);
    expectThrottled(over, "/sandbox?labels=%7B%7D");
    const f = figures(over, "authenticated");
    expect(f.retryAfter).toBeGreaterThanOrEqual(1);
    expect(f.retryAfter).toBeLessThanOrEqual(WINDOW);
    expect(f.counterRetryAfter).toBe(f.retryAfter);
    expect(f).toMatchObject({ limit: 4, remaining: 0, reset: f.retryAfter });

    // Creation and lifecycle have counters of their own (and do not touch this one).
    const create = await callFrom(from, t.url, "POST", "/sandbox", { ...as, body: { cpu: -1 } });
    expect(create.status).toBe(400);
    expect(figures(create, "sandbox-create")).toMatchObject({ limit: 2, remaining: 1, counterLimit: 2, counterRemaining: 1 });
    const start = await callFrom(from, t.url, "POST", `/sandbox/${randomUUID()}/start`, as);
    expect(start.status).toBe(404);
    expect(figures(start, "sandbox-lifecycle")).toMatchObject({ limit: 3, remaining: 2, counterRemaining: 2 });
    // Anonymous calls from the same address count by address, on their own counter.
    const anonymous = await callFrom(from, t.url, "GET", "/organizations/sandbox-identity/by-sandbox-auth-token/nope");
    expect(anonymous.status).toBe(404);
    expect(figures(anonymous, "anonymous")).toMatchObject({ limit: 3, remaining: 2 });
    // Still refused until the block ends, then a new window.
    expect((await callFrom(from, t.url, "GET", "/sandbox", as)).status).toBe(429);
    await sleep(f.retryAfter! * 1000 + 100);
    const again = await callFrom(from, t.url, "GET", "/sandbox", as);
    expect(again.status).toBe(200);
    expect(figures(again, "authenticated")).toMatchObject({ limit: 4, remaining: 3 });
  });

  it("sandbox creation: its own counter for POST /sandbox and /workspace, the general one untouched", async () => {
    const p = await person("create");
    const from = "127.0.0.3";
    const as = { token: p.jwt, headers: p.headers };
    const first = await callFrom(from, t.url, "POST", "/sandbox", { ...as, body: { cpu: -1 } });
    expect(first.status).toBe(400);
    expect(figures(first, "sandbox-create")).toMatchObject({ limit: 2, remaining: 1, counterLimit: 2, counterRemaining: 1 });
    // Headers of a counter other than the call's are absent.
    expect(first.headers["x-ratelimit-limit-authenticated"]).toBeUndefined();
    const second = await callFrom(from, t.url, "POST", "/workspace", { ...as, body: { cpu: -1 } });
    expect(second.status).toBe(400);
    expect(figures(second, "sandbox-create")).toMatchObject({ remaining: 0, counterRemaining: 0 });
    const over = await callFrom(from, t.url, "POST", "/sandbox", { ...as, body: { cpu: -1 } });
    expectThrottled(over, "/sandbox");
    expect(figures(over, "sandbox-create").counterRetryAfter).toBeGreaterThanOrEqual(1);
    expect(figures(over, "sandbox-create").retryAfter).toBe(figures(over, "sandbox-create").counterRetryAfter);
    // The general counter saw none of them.
    const list = await callFrom(from, t.url, "GET", "/sandbox", as);
    expect(list.status).toBe(200);
    expect(figures(list, "authenticated")).toMatchObject({ limit: 4, remaining: 3 });
    await sleep(figures(over, "sandbox-create").retryAfter! * 1000 + 100);
    const after = await callFrom(from, t.url, "POST", "/sandbox", { ...as, body: { cpu: -1 } });
    expect(after.status).toBe(400);
    expect(figures(after, "sandbox-create")).toMatchObject({ remaining: 1 });
  });

  it("sandbox lifecycle: start, stop, delete (also /workspace) and archive share a counter of their own", async () => {
    const p = await person("lifecycle");
    const from = "127.0.0.4";
    const as = { token: p.jwt, headers: p.headers };
    const id = randomUUID();
    const calls: Array<[string, string]> = [
      ["POST", `/sandbox/${id}/start`],
      ["POST", `/workspace/${id}/stop`],
      ["DELETE", `/workspace/${id}`],
    ];
    for (const [i, [verb, path]] of calls.entries()) {
      const a = await callFrom(from, t.url, verb, path, as);
      expect(a.status).toBe(404);
      expect(figures(a, "sandbox-lifecycle")).toMatchObject({ limit: 3, remaining: 2 - i, counterRemaining: 2 - i });
    }
    const over = await callFrom(from, t.url, "POST", `/sandbox/${id}/archive`, as);
    expectThrottled(over, `/sandbox/${id}/archive`);
    expect(figures(over, "sandbox-lifecycle").counterRetryAfter).toBeGreaterThanOrEqual(1);
    // Resize counts there too (refused as well), and the general counter is untouched.
    expect((await callFrom(from, t.url, "POST", `/sandbox/${id}/resize`, { ...as, body: { cpu: 2 } })).status).toBe(429);
    const get = await callFrom(from, t.url, "GET", `/sandbox/${id}`, as);
    expect(get.status).toBe(404);
    expect(figures(get, "authenticated")).toMatchObject({ limit: 4, remaining: 3 });
  });

  it("anonymous: counted by address; /config and /shared-regions are not counted; X-Forwarded-For is not believed", async () => {
    const from = "127.0.0.5";
    const path = "/organizations/sandbox-identity/by-sandbox-auth-token/nope";
    for (let i = 1; i <= LIMITS.anonymous; i++) {
      // A forged X-Forwarded-For does not make a new caller (no trusted proxy is configured).
      const a = await callFrom(from, t.url, "GET", path, { headers: { "x-forwarded-for": `203.0.113.${i}` } });
      expect(a.status).toBe(404);
      expect(figures(a, "anonymous")).toMatchObject({ limit: 3, remaining: 3 - i, counterLimit: 3, counterRemaining: 3 - i });
    }
    const over = await callFrom(from, t.url, "GET", path, { headers: { "x-forwarded-for": "203.0.113.99" } });
    expectThrottled(over, path);
    expect(figures(over, "anonymous").counterRetryAfter).toBeGreaterThanOrEqual(1);
    // Another address is another caller.
    expect((await callFrom("127.0.0.6", t.url, "GET", path)).status).toBe(404);
    // Exempt, as the reference: no counting, no headers.
    for (const exempt of ["/config", "/shared-regions"]) {
      const a = await callFrom(from, t.url, "GET", exempt);
      expect(a.status).toBe(200);
      expect(a.headers["x-ratelimit-limit"]).toBeUndefined();
    }
  });

  it("preview traffic through the path form is a web app's, not the API's: never counted", async () => {
    // Found by bench/preview: the path form passed the gateway's check of a public method and
    // counted as anonymous API calls, so a page past 600 requests a minute got 429s.
    const from = "127.0.0.8";
    const path = `/preview-proxy/${randomUUID()}/8000/index.html`;
    for (let i = 0; i < LIMITS.anonymous + 2; i++) {
      const a = await callFrom(from, t.url, "GET", path);
      expect(a.status).toBe(404); // no such sandbox, answered by the proxy itself
      expect(a.headers["x-ratelimit-limit"]).toBeUndefined();
    }
  });

  it("failed authentication: blocked at the limit-th 401 (plain Retry-After), refused before auth while blocked, not reset by a success", async () => {
    const p = await person("failed");
    const from = "127.0.0.7";
    const bad = "sbr_" + "0".repeat(64);
    for (let i = 1; i < LIMITS["failed-auth"]; i++) {
      const a = await callFrom(from, t.url, "GET", "/sandbox", { token: bad });
      expect(a.status).toBe(401);
      expect(a.headers["x-ratelimit-limit-failed-auth"]).toBe("3");
      expect(a.headers["x-ratelimit-remaining-failed-auth"]).toBe(String(3 - i));
      expect(Number(a.headers["x-ratelimit-reset-failed-auth"])).toBeGreaterThanOrEqual(1);
      expect(a.headers["retry-after"]).toBeUndefined();
    }
    const blocked = await callFrom(from, t.url, "GET", "/sandbox", { token: bad });
    expectThrottled(blocked, "/sandbox");
    expect(blocked.headers["retry-after"]).toBe(String(WINDOW));
    expect(blocked.headers["retry-after-failed-auth"]).toBeUndefined();
    expect(blocked.headers["x-ratelimit-remaining-failed-auth"]).toBe("0");
    // Good credentials from the blocked address are refused too, before they are read; /config as well.
    const good = { token: p.jwt, headers: p.headers };
    expectThrottled(await callFrom(from, t.url, "GET", "/sandbox", good), "/sandbox");
    expect((await callFrom(from, t.url, "GET", "/config")).status).toBe(429);
    // Other addresses are not blocked.
    expect((await callFrom("127.0.0.8", t.url, "GET", "/sandbox", good)).status).toBe(200);
    await sleep(WINDOW * 1000 + 100);
    expect((await callFrom(from, t.url, "GET", "/sandbox", good)).status).toBe(200);

    // A success between failures does not reset the count.
    const other = "127.0.0.9";
    expect((await callFrom(other, t.url, "GET", "/sandbox", { token: bad })).headers["x-ratelimit-remaining-failed-auth"]).toBe("2");
    expect((await callFrom(other, t.url, "GET", "/sandbox", good)).status).toBe(200);
    expect((await callFrom(other, t.url, "GET", "/sandbox", { token: bad })).headers["x-ratelimit-remaining-failed-auth"]).toBe("1");
  });

  it("an organization's own limit (quota update) applies at once, in place of the server's", async () => {
    const p = await person("override");
    const from = "127.0.0.10";
    const as = { token: p.jwt, headers: p.headers };
    expect(figures(await callFrom(from, t.url, "GET", "/sandbox", as), "authenticated")).toMatchObject({ limit: 4, remaining: 3 });
    const quota = await callFrom(from, t.url, "PATCH", `/organizations/${p.org}/quota`, { token: t.adminKey, body: { authenticatedRateLimit: 2, sandboxCreateRateLimit: 0 } });
    expect(quota.status).toBe(200);
    expect(quota.body).toMatchObject({ authenticatedRateLimit: 2 });
    // The quota update evicted the cached access everywhere: the next call already counts against 2.
    for (const remaining of [1, 0]) {
      expect(figures(await callFrom(from, t.url, "GET", "/sandbox", as), "authenticated")).toMatchObject({ limit: 2, remaining });
    }
    expectThrottled(await callFrom(from, t.url, "GET", "/sandbox", as), "/sandbox");
    // 0: no limit for this organization's creations.
    for (let i = 0; i < LIMITS["sandbox-create"] + 2; i++) {
      const a = await callFrom(from, t.url, "POST", "/sandbox", { ...as, body: { cpu: -1 } });
      expect(a.status).toBe(400);
      expect(a.headers["x-ratelimit-limit"]).toBeUndefined();
    }
  });

  it("the toolbox is not counted (its calls are work inside a sandbox, as the reference leaves them)", async () => {
    const p = await person("toolbox");
    const as = { token: p.jwt, headers: p.headers };
    for (let i = 0; i < LIMITS.authenticated + 1; i++) {
      const a = await callFrom("127.0.0.12", t.url, "GET", `/toolbox/${randomUUID()}/toolbox/files?path=/`, as);
      expect(a.status).toBe(404);
      expect(a.headers["x-ratelimit-limit"]).toBeUndefined();
    }
    // The organization's counter saw none of them.
    expect(figures(await callFrom("127.0.0.12", t.url, "GET", "/sandbox", as), "authenticated")).toMatchObject({ remaining: 3 });
  });

  it("GET /config shows the server's limits", async () => {
    const a = await callFrom("127.0.0.11", t.url, "GET", "/config");
    expect(a.body.rateLimit).toEqual({
      authenticated: { ttl: WINDOW, limit: 4 },
      sandboxCreate: { ttl: WINDOW, limit: 2 },
      sandboxLifecycle: { ttl: WINDOW, limit: 3 },
    });
  });

  it("gRPC: RESOURCE_EXHAUSTED past the limit, with the figures in its metadata", async () => {
    const p = await person("grpc");
    const key = await callFrom("127.0.0.1", t.url, "POST", "/api-keys", { token: p.jwt, headers: p.headers, body: { name: "grpc", permissions: ["write:sandboxes"] } });
    expect(key.status).toBe(201);
    const client = createClient(SandboxService, createGrpcTransport({ baseUrl: t.url }));
    const headers = { authorization: `Bearer ${key.body.value}` };
    // Making the key was the organization's first call.
    for (let i = 2; i <= LIMITS.authenticated; i++) {
      let seen: Headers | undefined;
      await client.listSandboxes({}, { headers, onHeader: (h) => (seen = h) });
      expect(seen?.get("x-ratelimit-limit")).toBe("4");
      expect(seen?.get("x-ratelimit-remaining")).toBe(String(4 - i));
      expect(seen?.get("x-ratelimit-remaining-authenticated")).toBe(String(4 - i));
    }
    const err = await client.listSandboxes({}, { headers }).then(
      () => expect.fail("the call past the limit went through"),
      (e: unknown) => ConnectError.from(e),
    );
    expect(err.code).toBe(Code.ResourceExhausted);
    expect(err.rawMessage).toBe("ThrottlerException: Too Many Requests");
    expect(Number(err.metadata.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(err.metadata.get("retry-after-authenticated")).toBe(err.metadata.get("retry-after"));
    expect(err.metadata.get("x-ratelimit-limit")).toBe("4");
    expect(err.metadata.get("x-ratelimit-remaining")).toBe("0");
  });

  it("the official client (0.218) raises DaytonaRateLimitError", async () => {
    const p = await person("sdk");
    const key = await callFrom("127.0.0.1", t.url, "POST", "/api-keys", { token: p.jwt, headers: p.headers, body: { name: "sdk", permissions: ["write:sandboxes"] } });
    const daytona = new Daytona({ apiKey: key.body.value, apiUrl: `${t.url}/api`, target: "us" });
    let error: unknown;
    // list() pages lazily: taking its first page is one call.
    const listOnce = async () => {
      for await (const _ of daytona.list()) break;
    };
    for (let i = 0; i <= LIMITS.authenticated && !error; i++) await listOnce().catch((e: unknown) => (error = e));
    expect(error).toBeInstanceOf(DaytonaRateLimitError);
    expect((error as DaytonaRateLimitError).statusCode).toBe(429);
  });
});

describe("rate limits (PostgreSQL store, two control processes)", () => {
  let a: TestServer;
  let b: TestServer;
  beforeAll(async () => {
    a = await startTestServer({ settings: { ...issuerSettings(idp), ...settings("postgres") } });
    b = await startTestServer({ databaseUrl: a.server.databaseUrl, adminKey: a.adminKey, settings: { ...issuerSettings(idp), ...settings("postgres") } });
  }, 120_000);
  afterAll(async () => {
    await b?.stop();
    await a?.stop();
  });

  it("share the authenticated counter: calls to either count against one limit", async () => {
    const p = await person("shared", a);
    const as = { token: p.jwt, headers: p.headers };
    const seen: number[] = [];
    for (let i = 0; i < LIMITS.authenticated; i++) {
      const r = await callFrom("127.0.0.20", (i % 2 ? b : a).url, "GET", "/sandbox", as);
      expect(r.status).toBe(200);
      seen.push(Number(r.headers["x-ratelimit-remaining"]));
    }
    expect(seen).toEqual([3, 2, 1, 0]);
    expectThrottled(await callFrom("127.0.0.20", a.url, "GET", "/sandbox", as), "/sandbox");
    // b learns of the block from the store (its own memory has not seen it).
    expectThrottled(await callFrom("127.0.0.20", b.url, "GET", "/sandbox", as), "/sandbox");
  });

  it("far from the limit count in batches, yet the call past it is refused exactly, wherever it lands", async () => {
    // 150 is above the batching margin (100): the first 50 or so calls are counted in memory.
    const p = await person("batched", a);
    const quota = await callFrom("127.0.0.22", a.url, "PATCH", `/organizations/${p.org}/quota`, { token: a.adminKey, body: { authenticatedRateLimit: 150 } });
    expect(quota.status).toBe(200);
    const as = { token: p.jwt, headers: p.headers };
    const statuses: number[] = [];
    for (let i = 0; i < 150; i++) statuses.push((await callFrom("127.0.0.22", (i % 2 ? b : a).url, "GET", "/sandbox", as)).status);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    expectThrottled(await callFrom("127.0.0.22", b.url, "GET", "/sandbox", as), "/sandbox");
    expectThrottled(await callFrom("127.0.0.22", a.url, "GET", "/sandbox", as), "/sandbox");
    // Every call is in the shared table: 150 allowed and the two refused.
    const rows = await a.server.orm.em.getConnection().execute(`select points from rate_limit where key = ?`, [`authenticated:auth:org:${p.org}`]);
    expect(rows[0].points).toBeGreaterThan(150);
  });

  it("count a user whose id is too long for the table's key (stored by digest) like any other", async () => {
    const sub = `ext|${"u".repeat(250)}`;
    const jwt = await idp.sign("k", { sub, email: "long@example.test", email_verified: true, name: "long" });
    for (let i = 1; i <= LIMITS.authenticated; i++) {
      const r = await callFrom("127.0.0.23", (i % 2 ? b : a).url, "GET", "/users/me", { token: jwt });
      expect(r.status).toBe(200);
      expect(figures(r, "authenticated")).toMatchObject({ limit: 4, remaining: 4 - i });
    }
    expectThrottled(await callFrom("127.0.0.23", a.url, "GET", "/users/me", { token: jwt }), "/users/me");
  });

  it("share failed authentications: a block made by one refuses good credentials at the other", async () => {
    const bad = "sbr_" + "1".repeat(64);
    const from = "127.0.0.21";
    expect((await callFrom(from, a.url, "GET", "/config", { token: bad })).status).toBe(200); // public: credentials are not read
    expect((await callFrom(from, a.url, "GET", "/api-keys/current", { token: bad })).status).toBe(401);
    expect((await callFrom(from, b.url, "GET", "/api-keys/current", { token: bad })).headers["x-ratelimit-remaining-failed-auth"]).toBe("1");
    expectThrottled(await callFrom(from, a.url, "GET", "/api-keys/current", { token: bad }), "/api-keys/current");
    // b looks blocks up at most once a second per address: it refuses once it has.
    await eventually("b to learn of the block", async () => (await callFrom(from, b.url, "GET", "/config")).status === 429);
    expectThrottled(await callFrom(from, b.url, "GET", "/config"), "/config");
  });
});
