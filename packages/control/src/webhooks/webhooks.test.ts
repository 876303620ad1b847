import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { ListValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { WebhookService } from "@sandbar/protocol/gen/sandbar/control/v1/webhook_pb.js";
import pg from "pg";
import { Webhook } from "standardwebhooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { execIn } from "../db/exec.ts";
import { isInternalAddress } from "./destinations.ts";
import { recordEvent } from "./index.ts";
import type { WebhookSettings } from "./settings.ts";
import { hostAddresses, inUrl } from "./testing/host-addresses.ts";
import { Receiver, type Received } from "./testing/receiver.ts";

// Webhooks end to end on a real server (embedded PostgreSQL) with real sandboxes, delivering to
// real HTTP receivers on 127.0.0.1 (so private destinations are allowed here; the suite at the
// end runs a server that refuses them). Polling is set to a minute: every delivery and retry
// below is woken by PostgreSQL notifications and the worker's due-time timer alone.

const SETTINGS: WebhookSettings = { allowPrivate: true, retryDelaysMs: [150, 300], timeoutMs: 3000, pollMs: 60_000, disableAfterMs: 0, concurrency: 8 };

const idp = new TestIssuer();
let t: TestServer;
let db: pg.Client;
const receivers: Receiver[] = [];
const base = (org: string) => `/webhooks/organizations/${org}/endpoints`;
const jwt = (sub: string) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: true, name: sub });

async function receiver(host?: string): Promise<Receiver> {
  const r = await new Receiver().start(host);
  receivers.push(r);
  return r;
}

/** The admin key's organization (the bootstrap "Default" one). */
async function adminOrg(server = t): Promise<string> {
  const orgs = (await api(server.url, server.adminKey, "GET", "/organizations")).body as Array<{ id: string }>;
  expect(orgs).toHaveLength(1);
  return orgs[0]!.id;
}

async function endpoint(org: string, url: string, extra: Record<string, unknown> = {}, token = t.adminKey) {
  const res = await api(t.url, token, "POST", base(org), { url, ...extra });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { endpoint: { id: string; url: string; eventTypes: string[]; enabled: boolean }; secret: string };
}

/** The endpoint's attempts (newest first), once at least `n` are recorded. */
async function attemptsOf(org: string, id: string, n: number, server = t): Promise<Array<Record<string, any>>> {
  const end = Date.now() + 15_000;
  for (;;) {
    const body = (await api(server.url, server.adminKey, "GET", `${base(org)}/${id}/attempts`)).body;
    if (body.total >= n || Date.now() > end) return body.items;
    await new Promise((res) => setTimeout(res, 100));
  }
}

/** The event a request carries, after checking its signature with the standardwebhooks verifier. */
function verified(r: Received, secret: string): Record<string, unknown> {
  return new Webhook(secret).verify(r.body, r.headers as Record<string, string>) as Record<string, unknown>;
}

beforeAll(async () => {
  await idp.start();
  await idp.addKey("k");
  t = await startTestServer({ settings: { ...issuerSettings(idp), webhooks: SETTINGS } });
  db = new pg.Client({ connectionString: t.server.databaseUrl });
  await db.connect();
});

afterAll(async () => {
  for (const r of receivers) await r.close();
  await db?.end();
  await t?.stop();
  idp.stop();
});

describe("webhook endpoints", () => {
  it("are made, read, changed, rotated and deleted; the secret is answered once and stored sealed", async () => {
    const org = await adminOrg();
    const made = await endpoint(org, "https://hooks.example.com/a", { description: "ci", eventTypes: ["sandbox.created", "sandbox.state.updated", "sandbox.created"] });
    expect(made.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(made.endpoint).toMatchObject({ url: "https://hooks.example.com/a", description: "ci", eventTypes: ["sandbox.created", "sandbox.state.updated"], enabled: true, organizationId: org });
    const id = made.endpoint.id;

    const [stored] = (await db.query(`select secret from webhook_endpoint where id = $1`, [id])).rows;
    expect(stored.secret).toMatch(/^v1:/);
    expect(stored.secret).not.toContain(made.secret.slice(6, 20));

    const got = await api(t.url, t.adminKey, "GET", `${base(org)}/${id}`);
    expect(got.status).toBe(200);
    expect(got.body).toEqual(made.endpoint);
    expect(JSON.stringify(got.body)).not.toContain("whsec_");
    const list = await api(t.url, t.adminKey, "GET", base(org));
    expect(list.body.map((e: { id: string }) => e.id)).toContain(id);
    expect(JSON.stringify(list.body)).not.toContain("whsec_");

    const changed = await api(t.url, t.adminKey, "PATCH", `${base(org)}/${id}`, { url: "https://hooks.example.com/b", eventTypes: [], enabled: false });
    expect(changed.status, JSON.stringify(changed.body)).toBe(200);
    expect(changed.body).toMatchObject({ url: "https://hooks.example.com/b", description: "ci", eventTypes: [], enabled: false });
    // Absent fields stay as they are.
    expect((await api(t.url, t.adminKey, "PATCH", `${base(org)}/${id}`, { description: "nightly" })).body).toMatchObject({ url: "https://hooks.example.com/b", description: "nightly", enabled: false });

    const rotated = await api(t.url, t.adminKey, "POST", `${base(org)}/${id}/rotate-secret`);
    expect(rotated.status).toBe(200);
    expect(rotated.body.secret).toMatch(/^whsec_/);
    expect(rotated.body.secret).not.toBe(made.secret);

    expect((await api(t.url, t.adminKey, "DELETE", `${base(org)}/${id}`)).status).toBe(204);
    expect((await api(t.url, t.adminKey, "GET", `${base(org)}/${id}`)).body).toMatchObject({ statusCode: 404, message: `Webhook endpoint with ID ${id} not found` });
    expect((await api(t.url, t.adminKey, "DELETE", `${base(org)}/${id}`)).status).toBe(404);
  });

  it("refuse bad input with a 400 naming the field, and unknown ids with a 404", async () => {
    const org = await adminOrg();
    const bad = async (verb: string, path: string, body: unknown) => {
      const res = await api(t.url, t.adminKey, verb, path, body);
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      return res.body.message as string;
    };
    expect(await bad("POST", base(org), { url: "not a url" })).toBe("url must be a valid URL");
    expect(await bad("POST", base(org), { url: "" })).toBe("url must be a valid URL");
    expect(await bad("POST", base(org), { url: "file:///etc/passwd" })).toBe("url must use http or https");
    expect(await bad("POST", base(org), { url: "https://a:b@hooks.example.com/" })).toBe("url must not contain a user name or password");
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", eventTypes: ["sandbox.exploded"] })).toMatch(/^eventTypes must each be one of the following values: sandbox.created, .* \(got "sandbox.exploded"\)$/);
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", description: "x".repeat(1025) })).toBe("description must be shorter than or equal to 1024 characters");
    expect(await bad("POST", base(org), { url: "https://hooks.example.com/", enabled: "yes" })).toMatch(/enabled/);
    const { endpoint: e } = await endpoint(org, "https://hooks.example.com/c");
    expect(await bad("PATCH", `${base(org)}/${e.id}`, { eventTypes: [1] })).toBe("eventTypes must be an array of strings");
    expect(await bad("PATCH", `${base(org)}/${e.id}`, { url: "gopher://x" })).toBe("url must use http or https");
    expect(await bad("GET", `${base(org)}/${e.id}/attempts?page=0`, undefined)).toBe("page must be a positive integer");
    expect(await bad("GET", `${base(org)}/${e.id}/attempts?limit=500`, undefined)).toBe("limit must be an integer from 1 to 200");
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
    for (const id of ["nope", randomUUID()]) {
      for (const [verb, suffix] of [["GET", ""], ["PATCH", ""], ["DELETE", ""], ["POST", "/rotate-secret"], ["POST", "/test"], ["GET", "/attempts"]] as const) {
        const res = await api(t.url, t.adminKey, verb, `${base(org)}/${id}${suffix}`, verb === "PATCH" ? {} : undefined);
        expect(res.status, `${verb} ${suffix} ${id}`).toBe(404);
      }
    }
  });

  it("are changed by owners only; members read them", async () => {
    const [olga, mo] = [await jwt("olga"), await jwt("mo")];
    const org = (await api(t.url, olga, "POST", "/organizations", { name: "olga's team", defaultRegionId: "local" })).body.id as string;
    await api(t.url, mo, "GET", "/organizations");
    const inv = await api(t.url, olga, "POST", `/organizations/${org}/invitations`, { email: "mo@example.test", role: "member" });
    expect((await api(t.url, mo, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    const { endpoint: e } = await endpoint(org, "https://hooks.example.com/olga", {}, olga);
    expect((await api(t.url, mo, "GET", base(org))).body.map((x: { id: string }) => x.id)).toEqual([e.id]);
    expect((await api(t.url, mo, "GET", `${base(org)}/${e.id}/attempts`)).status).toBe(200);
    for (const [verb, path, body] of [
      ["POST", base(org), { url: "https://hooks.example.com/mo" }],
      ["PATCH", `${base(org)}/${e.id}`, { enabled: false }],
      ["DELETE", `${base(org)}/${e.id}`, undefined],
      ["POST", `${base(org)}/${e.id}/rotate-secret`, undefined],
      ["POST", `${base(org)}/${e.id}/test`, undefined],
    ] as const) {
      expect((await api(t.url, mo, verb, path, body)).body, `${verb} ${path}`).toMatchObject({ statusCode: 403, message: "Access denied" });
    }
  });
});

describe("webhook endpoints over gRPC", () => {
  it("take the same calls and rules as REST", async () => {
    const client = createClient(
      WebhookService,
      createGrpcTransport({ baseUrl: t.url, interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${t.adminKey}`), next(req))] }),
    );
    const organizationId = await adminOrg();
    const made = await client.createWebhookEndpoint({ organizationId, url: "https://hooks.example.com/grpc", eventTypes: ["sandbox.created"] });
    expect(made.secret).toMatch(/^whsec_/);
    const list = (types: string[]) => create(ListValueSchema, { values: types.map((v) => ({ kind: { case: "stringValue" as const, value: v } })) });
    const changed = await client.updateWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id, eventTypes: list(["sandbox.state.updated", "organization.member.added"]) });
    expect(changed.eventTypes).toEqual(["sandbox.state.updated", "organization.member.added"]);
    const refused = await client.updateWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id, eventTypes: list(["nope"]) }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ConnectError);
    expect((refused as ConnectError).code).toBe(Code.InvalidArgument);
    const missing = await client.getWebhookEndpoint({ organizationId, endpointId: randomUUID() }).catch((e: unknown) => e);
    expect((missing as ConnectError).code).toBe(Code.NotFound);
    await client.deleteWebhookEndpoint({ organizationId, endpointId: made.endpoint!.id });
  });
});

describe("webhook delivery", () => {
  it("delivers a sandbox's creation and state changes, signed per Standard Webhooks, with the reference's payloads", async () => {
    const r = await receiver();
    const org = await adminOrg();
    const { endpoint: e, secret } = await endpoint(org, r.url, { eventTypes: ["sandbox.created", "sandbox.state.updated"] });
    const created = await api(t.url, t.adminKey, "POST", "/sandbox", { name: `hooked-${Date.now()}` });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const id = created.body.id as string;
    expect((await api(t.url, t.adminKey, "POST", `/sandbox/${id}/stop`)).body.state).toBe("stopped");

    const mine = () => r.accepted().filter((g) => JSON.parse(g.body).id === id);
    await r.until("four sandbox events", () => mine().length >= 4);
    const events = mine().map((g) => verified(g, secret)).sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    expect(events.map((ev) => Object.keys(ev).sort())).toEqual([
      ["createdAt", "event", "id", "organizationId", "sandboxClass", "state", "timestamp"],
      ...Array(3).fill(["event", "id", "newState", "oldState", "organizationId", "timestamp", "updatedAt"]),
    ]);
    expect(events[0]).toMatchObject({ event: "sandbox.created", id, organizationId: org, state: "creating", sandboxClass: "container" });
    expect(Date.parse(String(events[0]!.createdAt))).toBe(Date.parse(created.body.createdAt));
    expect(events.slice(1).map((ev) => [ev.event, ev.oldState, ev.newState])).toEqual([
      ["sandbox.state.updated", "creating", "started"],
      ["sandbox.state.updated", "started", "stopping"],
      ["sandbox.state.updated", "stopping", "stopped"],
    ]);
    for (const ev of events) expect(new Date(String(ev.timestamp)).toISOString()).toBe(ev.timestamp);

    // Headers as Standard Webhooks names them; a tampered body or another secret does not verify.
    const first = mine()[0]!;
    expect(first.headers["webhook-id"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(Math.abs(Number(first.headers["webhook-timestamp"]) - Date.now() / 1000)).toBeLessThan(60);
    expect(first.headers["webhook-signature"]).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
    expect(first.headers["content-type"]).toBe("application/json");
    expect(() => new Webhook(secret).verify(first.body.replace(id, randomUUID()), first.headers as Record<string, string>)).toThrow();
    expect(() => new Webhook("whsec_" + Buffer.alloc(32, 7).toString("base64")).verify(first.body, first.headers as Record<string, string>)).toThrow();

    // Each attempt is listed, with the message id receivers saw.
    const attemptsPage = () => api(t.url, t.adminKey, "GET", `${base(org)}/${e.id}/attempts?limit=2`);
    let attempts = await attemptsPage();
    // The last success is recorded just after the receiver answered.
    for (let i = 0; i < 50 && attempts.body.total < 4; i++) attempts = await new Promise((res) => setTimeout(res, 100)).then(attemptsPage);
    expect(attempts.body).toMatchObject({ total: 4, page: 1, totalPages: 2 });
    expect(attempts.body.items).toHaveLength(2);
    expect(attempts.body.items[0]).toMatchObject({ success: true, statusCode: 200, attempt: 1, responseBody: "ok" });
    expect(mine().map((g) => g.id)).toContain(attempts.body.items[0].messageId);

    // Filtered: a delete is delivered only to endpoints that want state changes; this one does.
    await api(t.url, t.adminKey, "DELETE", `/sandbox/${id}`);
    await r.until("the delete's events", () => mine().length >= 6);
    expect(mine().slice(4).map((g) => JSON.parse(g.body).newState).sort()).toEqual(["destroyed", "destroying"]);
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("retries after receiver errors with the same webhook-id and body, then records the success", async () => {
    const r = await receiver();
    r.answer = (_got, nth) => (nth < 3 ? 500 : 204);
    const org = await adminOrg();
    const { endpoint: e, secret } = await endpoint(org, r.url);
    const sent = await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    expect(sent.status).toBe(202);
    const messageId = sent.body.messageId as string;
    await r.until("the third attempt", () => r.accepted().length === 1);
    expect(r.got.map((g) => [g.id, g.status])).toEqual([[messageId, 500], [messageId, 500], [messageId, 204]]);
    expect(new Set(r.got.map((g) => g.body)).size).toBe(1);
    for (const g of r.got) expect(verified(g, secret)).toMatchObject({ event: "webhook.test", organizationId: org, endpointId: e.id });
    // Backoff as configured: 150 ms, then 300 ms.
    expect(r.got[1]!.at - r.got[0]!.at).toBeGreaterThanOrEqual(140);
    expect(r.got[2]!.at - r.got[1]!.at).toBeGreaterThanOrEqual(290);

    const attempts = { items: await attemptsOf(org, e.id, 3) };
    expect(attempts.items.map((a: Record<string, unknown>) => [a.attempt, a.statusCode, a.success, a.error ?? null, a.messageId])).toEqual([
      [3, 204, true, null, messageId],
      [2, 500, false, "HTTP 500", messageId],
      [1, 500, false, "HTTP 500", messageId],
    ]);
    expect(attempts.items[2].responseBody).toBe("receiver says no");
    expect(attempts.items[0].nextAttemptAt).toBeNull();
    expect(Date.parse(attempts.items[1].nextAttemptAt) - Date.parse(attempts.items[1].createdAt)).toBeGreaterThanOrEqual(300);
    expect((await api(t.url, t.adminKey, "GET", `${base(org)}/${e.id}`)).body.enabled).toBe(true);
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("gives up on a receiver that does not answer within the timeout", async () => {
    const r = await receiver();
    r.answer = () => "hang";
    const org = await adminOrg();
    const { endpoint: e } = await endpoint(org, r.url);
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    const [first] = await attemptsOf(org, e.id, 1);
    expect(first).toMatchObject({ success: false, error: "no answer within 3000 ms", attempt: 1, statusCode: null });
    expect(first!.durationMs).toBeGreaterThanOrEqual(2900);
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("reads only a prefix of a receiver's answer and follows no redirect", async () => {
    let closed = false;
    let sent = 0;
    const endless = createServer((req, res) => {
      req.resume();
      if (req.url === "/moved") return void res.writeHead(302, { location: "/elsewhere" }).end();
      res.writeHead(200, { "content-type": "text/plain" });
      const chunk = Buffer.alloc(64 * 1024, "x");
      const pump = () => {
        while (!closed && res.write(chunk)) sent += chunk.length;
        if (!closed) res.once("drain", pump);
      };
      res.on("close", () => (closed = true));
      pump();
    });
    await new Promise<void>((res) => endless.listen(0, "127.0.0.1", res));
    const port = (endless.address() as AddressInfo).port;
    try {
      const org = await adminOrg();
      const { endpoint: big } = await endpoint(org, `http://127.0.0.1:${port}/big`);
      await api(t.url, t.adminKey, "POST", `${base(org)}/${big.id}/test`);
      const [first] = await attemptsOf(org, big.id, 1);
      expect(first).toMatchObject({ success: true, statusCode: 200, responseBody: "x".repeat(1024) });
      // The connection was dropped after the prefix: the endless answer stopped.
      await new Promise((res) => setTimeout(res, 200));
      expect(closed).toBe(true);
      expect(sent).toBeLessThan(64 * 1024 * 1024);

      const { endpoint: moved } = await endpoint(org, `http://127.0.0.1:${port}/moved`);
      await api(t.url, t.adminKey, "POST", `${base(org)}/${moved.id}/test`);
      const [redirected] = await attemptsOf(org, moved.id, 1);
      expect(redirected).toMatchObject({ success: false, statusCode: 302, error: "HTTP 302" });
      await api(t.url, t.adminKey, "DELETE", `${base(org)}/${big.id}`);
      await api(t.url, t.adminKey, "DELETE", `${base(org)}/${moved.id}`);
    } finally {
      endless.closeAllConnections();
      endless.close();
    }
  });

  it("disables an endpoint after sustained failure, then delivers again once re-enabled", async () => {
    const r = await receiver();
    r.answer = () => 503;
    const org = await adminOrg();
    const { endpoint: e } = await endpoint(org, r.url);
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    const read = async () => (await api(t.url, t.adminKey, "GET", `${base(org)}/${e.id}`)).body;
    const until = Date.now() + 10_000;
    while ((await read()).enabled && Date.now() < until) await new Promise((res) => setTimeout(res, 100));
    const off = await read();
    expect(off.enabled).toBe(false);
    expect(off.disabledReason).toMatch(/^Disabled after sustained delivery failure: every attempt since .* failed and an event exhausted its 3 attempts$/);
    expect(r.got.map((g) => g.status)).toEqual([503, 503, 503]);
    // Disabled: no new event is queued for it, and a test is refused.
    expect((await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body).toMatchObject({ statusCode: 409, message: "Webhook endpoint is disabled; enable it to send a test event" });

    r.answer = () => 200;
    const on = await api(t.url, t.adminKey, "PATCH", `${base(org)}/${e.id}`, { enabled: true });
    expect(on.body.enabled).toBe(true);
    expect(on.body.disabledReason).toBeNull();
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("delivery after re-enabling", () => r.accepted().length === 1);
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("signs with the old secret too for a while after a rotation, so receivers can switch over", async () => {
    const r = await receiver();
    const org = await adminOrg();
    const { endpoint: e, secret: old } = await endpoint(org, r.url);
    const fresh = (await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/rotate-secret`)).body.secret as string;
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the test event", () => r.accepted().length === 1);
    const got = r.accepted()[0]!;
    expect(String(got.headers["webhook-signature"]).split(" ")).toHaveLength(2);
    expect(verified(got, fresh)).toMatchObject({ event: "webhook.test" });
    expect(verified(got, old)).toMatchObject({ event: "webhook.test" });
    // Once the grace has passed, only the new secret signs.
    await db.query(`update webhook_endpoint set previous_secret_until = now() - interval '1 second' where id = $1`, [e.id]);
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the second test event", () => r.accepted().length === 2);
    const second = r.accepted()[1]!;
    expect(verified(second, fresh)).toMatchObject({ event: "webhook.test" });
    expect(() => verified(second, old)).toThrow();

    // A secret sealed under another key cannot sign: the attempt says so, and a rotation mends it.
    await db.query(`update webhook_endpoint set secret = $2 where id = $1`, [e.id, "v1:" + Buffer.alloc(48, 1).toString("base64")]);
    const stuck = (await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body.messageId as string;
    const [unreadable] = await attemptsOf(org, e.id, 3);
    expect(unreadable).toMatchObject({ messageId: stuck, success: false, statusCode: null, error: "the endpoint's signing secret cannot be read (was SANDBAR_ENCRYPTION_KEY changed?); rotate the secret" });
    expect(r.got).toHaveLength(2);
    // The unreadable one is now the previous secret (within its grace): the new one signs alone.
    const mended = (await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/rotate-secret`)).body.secret as string;
    await r.until("the retry after the rotation", () => r.accepted().some((g) => g.id === stuck));
    const retried = r.accepted().find((g) => g.id === stuck)!;
    expect(String(retried.headers["webhook-signature"]).split(" ")).toHaveLength(1);
    expect(verified(retried, mended)).toMatchObject({ event: "webhook.test" });
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("records an event only with the transaction that makes the change: rolled back, nothing is sent", async () => {
    const r = await receiver();
    // An organization of its own: its one endpoint is the only subscriber.
    const vera = await jwt("vera");
    const org = (await api(t.url, vera, "POST", "/organizations", { name: "vera's team", defaultRegionId: "local" })).body.id as string;
    const { secret } = await endpoint(org, r.url, { eventTypes: ["volume.created"] }, vera);
    const volume = { id: randomUUID(), name: "v1", organizationId: org, state: "ready", createdAt: new Date().toISOString() };
    const countOf = async () => (await db.query(`select count(*)::int as n from webhook_message where organization_id = $1`, [org])).rows[0].n as number;
    const before = await countOf();
    // What the volumes feature will do: record inside its own transaction.
    const failed = await t.server.orm.em.fork().transactional(async (em) => {
      await recordEvent(execIn(em), org, "volume.created", volume);
      throw new Error("the change failed");
    }).catch((err: Error) => err.message);
    expect(failed).toBe("the change failed");
    expect((await countOf())).toBe(before);
    // Not subscribed: nothing is written at all.
    await t.server.orm.em.fork().transactional((em) => recordEvent(execIn(em), org, "snapshot.removed", { id: randomUUID(), name: "s", organizationId: org, removedAt: new Date().toISOString() }));
    expect((await countOf())).toBe(before);

    const id = await t.server.orm.em.fork().transactional((em) => recordEvent(execIn(em), org, "volume.created", volume));
    await r.until("the committed event", () => r.accepted().length === 1);
    expect(r.got.map((g) => g.id)).toEqual([id]);
    expect(verified(r.got[0]!, secret)).toEqual({ event: "volume.created", timestamp: expect.any(String), ...volume });
  });

  it("listens again after losing its PostgreSQL connection", async () => {
    const r = await receiver();
    const org = await adminOrg();
    const { endpoint: e } = await endpoint(org, r.url);
    const listeners = async () => (await db.query(`select pid from pg_stat_activity where query = 'LISTEN sandbar_webhooks'`)).rows.map((x) => x.pid as number);
    const old = await listeners();
    expect(old).toHaveLength(1);
    await db.query(`select pg_terminate_backend($1)`, [old[0]]);
    const until = Date.now() + 10_000;
    while (!(await listeners()).some((pid) => pid !== old[0]) && Date.now() < until) await new Promise((res) => setTimeout(res, 100));
    // Polling is a minute here: only a notification brings this event in time.
    const started = Date.now();
    await api(t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the event after reconnecting", () => r.accepted().length === 1, 5000);
    expect(Date.now() - started).toBeLessThan(5000);
    await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("sends membership events: added, updated, removed", async () => {
    const r = await receiver();
    const [pat, sam] = [await jwt("pat"), await jwt("sam")];
    const org = (await api(t.url, pat, "POST", "/organizations", { name: "pat's team", defaultRegionId: "local" })).body.id as string;
    const { secret } = await endpoint(org, r.url, { eventTypes: ["organization.member.added", "organization.member.updated", "organization.member.removed"] }, pat);
    await api(t.url, sam, "GET", "/organizations");
    const DEVELOPER = "00000000-0000-0000-0000-000000000001";
    const inv = await api(t.url, pat, "POST", `/organizations/${org}/invitations`, { email: "sam@example.test", role: "member", assignedRoleIds: [DEVELOPER] });
    expect((await api(t.url, sam, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    expect((await api(t.url, pat, "POST", `/organizations/${org}/users/sam/access`, { role: "owner", assignedRoleIds: [] })).status).toBe(200);
    expect((await api(t.url, sam, "POST", `/organizations/${org}/leave`)).status).toBe(204);
    await r.until("three membership events", () => r.accepted().length === 3);
    const events = r.accepted().map((g) => verified(g, secret)).sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    expect(events.map(({ timestamp: _, ...rest }) => rest)).toEqual([
      { event: "organization.member.added", organizationId: org, userId: "sam", role: "member", assignedRoleIds: [DEVELOPER] },
      { event: "organization.member.updated", organizationId: org, userId: "sam", role: "owner", assignedRoleIds: [] },
      { event: "organization.member.removed", organizationId: org, userId: "sam" },
    ]);
  });

  it("two control processes on one database deliver each event exactly once between them, polling for what no notification announced", async () => {
    const r = await receiver();
    r.answer = () => 200;
    // The second process polls often; the first (a minute) relies on notifications.
    const second = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey, settings: { webhooks: { ...SETTINGS, pollMs: 250 } } });
    try {
      const org = await adminOrg();
      const { endpoint: e } = await endpoint(org, r.url);
      const ids = await Promise.all(
        Array.from({ length: 40 }, async (_, i) => (await api(i % 2 ? second.url : t.url, t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body.messageId as string),
      );
      await r.until("forty events", () => r.accepted().length >= 40);
      await new Promise((res) => setTimeout(res, 500)); // time for a duplicate to show, were there one
      expect(r.got.map((g) => g.id).sort()).toEqual([...ids].sort());

      // An event whose notification was lost (queued here without one) is found by polling.
      const lost = randomUUID();
      await db.query(`insert into webhook_message (id, organization_id, event_type, body) values ($1, $2, 'webhook.test', '{"event":"webhook.test"}')`, [lost, org]);
      await db.query(`insert into webhook_delivery (id, message_id, endpoint_id) values ($1, $2, $3)`, [randomUUID(), lost, e.id]);
      await r.until("the event without a notification", () => r.accepted().some((g) => g.id === lost), 5000);
      await api(t.url, t.adminKey, "DELETE", `${base(org)}/${e.id}`);
    } finally {
      await second.stop();
    }
  });
});

describe("webhook destinations on a server that refuses private ones", () => {
  let strict: TestServer;
  beforeAll(async () => {
    strict = await startTestServer({ settings: { webhooks: { ...SETTINGS, allowPrivate: false } } });
  });
  afterAll(async () => {
    await strict?.stop();
  });

  it("refuses internal addresses on create and update, and at delivery", async () => {
    const r = await receiver();
    const org = await adminOrg(strict);
    for (const url of [r.url, "http://localhost:9/x", "http://[::1]/x", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.0.10/", "http://[fe80::1]/"]) {
      const res = await api(strict.url, strict.adminKey, "POST", base(org), { url });
      expect(res.status, url).toBe(400);
      expect(res.body.message, url).toMatch(/^url must not point at an internal address .*SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
    }
    const made = await api(strict.url, strict.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    expect(made.status).toBe(201);
    const id = made.body.endpoint.id as string;
    expect((await api(strict.url, strict.adminKey, "PATCH", `${base(org)}/${id}`, { url: r.url })).status).toBe(400);

    // A destination that turned internal after it was checked (as a DNS name can) is refused
    // when delivering: the row is changed behind the API's back to stand for that.
    const sdb = new pg.Client({ connectionString: strict.server.databaseUrl });
    await sdb.connect();
    await sdb.query(`update webhook_endpoint set url = $1 where id = $2`, [r.url, id]);
    await sdb.end();
    await api(strict.url, strict.adminKey, "POST", `${base(org)}/${id}/test`);
    const attempts = await attemptsOf(org, id, 1, strict);
    expect(attempts[0]).toMatchObject({ success: false, error: "destination 127.0.0.1 is an internal address" });
    expect(r.got).toEqual([]);
  });

  it("refuses this host's own addresses (every interface's) and IPv6 forms carrying an internal IPv4, on create and update", async () => {
    const org = await adminOrg(strict);
    const made = await api(strict.url, strict.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    expect(made.status).toBe(201);
    const id = made.body.endpoint.id as string;
    const own = hostAddresses();
    expect(own.length, "this test needs an interface besides loopback").toBeGreaterThan(0);
    for (const a of own) {
      const url = `http://${inUrl(a)}:8080/hook`;
      const why = isInternalAddress(a) ? "an internal address" : "an address of this server";
      for (const res of [await api(strict.url, strict.adminKey, "POST", base(org), { url }), await api(strict.url, strict.adminKey, "PATCH", `${base(org)}/${id}`, { url })]) {
        expect(res.status, url).toBe(400);
        expect(res.body.message, url).toMatch(new RegExp(`^url must not point at ${why} \\(.*\\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true`));
      }
    }
    for (const url of ["http://[::127.0.0.1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:10.0.0.1]/", "http://[64:ff9b::10.0.0.1]/", "http://[2002:a00:1::1]/", "http://2130706433/", "http://0x7f.1/"]) {
      const res = await api(strict.url, strict.adminKey, "PATCH", `${base(org)}/${id}`, { url });
      expect(res.status, url).toBe(400);
      expect(res.body.message, url).toMatch(/^url must not point at an internal address \(.*\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
    }
    expect((await api(strict.url, strict.adminKey, "GET", `${base(org)}/${id}`)).body.url).toBe("https://hooks.example.com/x");
    await api(strict.url, strict.adminKey, "DELETE", `${base(org)}/${id}`);
  });

  // An address of this host outside the private ranges (a public address on eth0): only the
  // own-address rule refuses it. Hosts without one have nothing for this case to show.
  const publicOwn = hostAddresses().find((a) => !isInternalAddress(a));
  it.skipIf(!publicOwn)("refuses at delivery an address of this host outside the private ranges, reading no answer from it", async () => {
    const r = await receiver(publicOwn);
    const org = await adminOrg(strict);
    const made = await api(strict.url, strict.adminKey, "POST", base(org), { url: "https://hooks.example.com/x" });
    const id = made.body.endpoint.id as string;
    // The row is pointed at the host's address behind the API's back: a destination that changed after its check.
    const sdb = new pg.Client({ connectionString: strict.server.databaseUrl });
    await sdb.connect();
    await sdb.query(`update webhook_endpoint set url = $1 where id = $2`, [r.url, id]);
    await sdb.end();
    await api(strict.url, strict.adminKey, "POST", `${base(org)}/${id}/test`);
    const [attempt] = await attemptsOf(org, id, 1, strict);
    expect(attempt).toMatchObject({ success: false, statusCode: null, error: `destination ${publicOwn} is an address of this server` });
    expect(attempt!.responseBody ?? undefined).toBeUndefined();
    expect(r.got).toEqual([]);
    await api(strict.url, strict.adminKey, "DELETE", `${base(org)}/${id}`);
  });
});
