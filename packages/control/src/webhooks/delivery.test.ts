import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Webhook } from "standardwebhooks";
import { describe, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { api } from "../testing/server.ts";
import { base, verified, webhookSuite } from "./testing/suite.ts";

// Delivering to receivers: payloads and signatures, retries, timeouts, answers read, disabling, rotation.

const w = webhookSuite();

describe("webhook delivery", () => {
  it("delivers a sandbox's creation and state changes, signed per Standard Webhooks, with the reference's payloads", async () => {
    const r = await w.receiver();
    const org = await w.adminOrg();
    const { endpoint: e, secret } = await w.endpoint(org, r.url, { eventTypes: ["sandbox.created", "sandbox.state.updated"] });
    const created = await api(w.t.url, w.t.adminKey, "POST", "/sandbox", { name: `hooked-${Date.now()}` });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const id = created.body.id as string;
    expect((await api(w.t.url, w.t.adminKey, "POST", `/sandbox/${id}/stop`)).body.state).toBe("stopped");

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
    const attemptsPage = () => api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${e.id}/attempts?limit=2`);
    let attempts = await attemptsPage();
    // The last success is recorded just after the receiver answered.
    await eventually("the fourth attempt recorded", async () => (attempts = await attemptsPage()).body.total >= 4);
    expect(attempts.body).toMatchObject({ total: 4, page: 1, totalPages: 2 });
    expect(attempts.body.items).toHaveLength(2);
    expect(attempts.body.items[0]).toMatchObject({ success: true, statusCode: 200, attempt: 1, responseBody: "ok" });
    expect(mine().map((g) => g.id)).toContain(attempts.body.items[0].messageId);

    // Filtered: a delete is delivered only to endpoints that want state changes; this one does.
    await api(w.t.url, w.t.adminKey, "DELETE", `/sandbox/${id}`);
    await r.until("the delete's events", () => mine().length >= 6);
    expect(mine().slice(4).map((g) => JSON.parse(g.body).newState).sort()).toEqual(["destroyed", "destroying"]);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("retries after receiver errors with the same webhook-id and body, then records the success", async () => {
    const r = await w.receiver();
    r.answer = (_got, nth) => (nth < 3 ? 500 : 204);
    const org = await w.adminOrg();
    const { endpoint: e, secret } = await w.endpoint(org, r.url);
    const sent = await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    expect(sent.status).toBe(202);
    const messageId = sent.body.messageId as string;
    await r.until("the third attempt", () => r.accepted().length === 1);
    expect(r.got.map((g) => [g.id, g.status])).toEqual([[messageId, 500], [messageId, 500], [messageId, 204]]);
    expect(new Set(r.got.map((g) => g.body)).size).toBe(1);
    for (const g of r.got) expect(verified(g, secret)).toMatchObject({ event: "webhook.test", organizationId: org, endpointId: e.id });
    // Backoff as configured: 150 ms, then 300 ms.
    expect(r.got[1]!.at - r.got[0]!.at).toBeGreaterThanOrEqual(140);
    expect(r.got[2]!.at - r.got[1]!.at).toBeGreaterThanOrEqual(290);

    const attempts = { items: await w.attemptsOf(org, e.id, 3) };
    expect(attempts.items.map((a: Record<string, unknown>) => [a.attempt, a.statusCode, a.success, a.error ?? null, a.messageId])).toEqual([
      [3, 204, true, null, messageId],
      [2, 500, false, "HTTP 500", messageId],
      [1, 500, false, "HTTP 500", messageId],
    ]);
    expect(attempts.items[2].responseBody).toBe("receiver says no");
    expect(attempts.items[0].nextAttemptAt).toBeNull();
    expect(Date.parse(attempts.items[1].nextAttemptAt) - Date.parse(attempts.items[1].createdAt)).toBeGreaterThanOrEqual(300);
    expect((await api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${e.id}`)).body.enabled).toBe(true);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("gives up on a receiver that does not answer within the timeout", async () => {
    const r = await w.receiver();
    r.answer = () => "hang";
    const org = await w.adminOrg();
    const { endpoint: e } = await w.endpoint(org, r.url);
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    const [first] = await w.attemptsOf(org, e.id, 1);
    expect(first).toMatchObject({ success: false, error: "no answer within 3000 ms", attempt: 1, statusCode: null });
    expect(first!.durationMs).toBeGreaterThanOrEqual(2900);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
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
      const org = await w.adminOrg();
      const { endpoint: big } = await w.endpoint(org, `http://127.0.0.1:${port}/big`);
      await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${big.id}/test`);
      const [first] = await w.attemptsOf(org, big.id, 1);
      expect(first).toMatchObject({ success: true, statusCode: 200, responseBody: "x".repeat(1024) });
      // The connection was dropped after the prefix: the endless answer stopped.
      await eventually("the endless answer's connection to close", () => closed);
      expect(sent).toBeLessThan(64 * 1024 * 1024);

      const { endpoint: moved } = await w.endpoint(org, `http://127.0.0.1:${port}/moved`);
      await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${moved.id}/test`);
      const [redirected] = await w.attemptsOf(org, moved.id, 1);
      expect(redirected).toMatchObject({ success: false, statusCode: 302, error: "HTTP 302" });
      await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${big.id}`);
      await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${moved.id}`);
    } finally {
      endless.closeAllConnections();
      endless.close();
    }
  });

  it("disables an endpoint after sustained failure, then delivers again once re-enabled", async () => {
    const r = await w.receiver();
    r.answer = () => 503;
    const org = await w.adminOrg();
    const { endpoint: e } = await w.endpoint(org, r.url);
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    const read = async () => (await api(w.t.url, w.t.adminKey, "GET", `${base(org)}/${e.id}`)).body;
    await eventually("the endpoint to be disabled", async () => !(await read()).enabled);
    const off = await read();
    expect(off.enabled).toBe(false);
    expect(off.disabledReason).toMatch(/^Disabled after sustained delivery failure: every attempt since .* failed and an event exhausted its 3 attempts$/);
    expect(r.got.map((g) => g.status)).toEqual([503, 503, 503]);
    // Disabled: no new event is queued for it, and a test is refused.
    expect((await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body).toMatchObject({ statusCode: 409, message: "Webhook endpoint is disabled; enable it to send a test event" });

    r.answer = () => 200;
    const on = await api(w.t.url, w.t.adminKey, "PATCH", `${base(org)}/${e.id}`, { enabled: true });
    expect(on.body.enabled).toBe(true);
    expect(on.body.disabledReason).toBeNull();
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("delivery after re-enabling", () => r.accepted().length === 1);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("signs with the old secret too for a while after a rotation, so receivers can switch over", async () => {
    const r = await w.receiver();
    const org = await w.adminOrg();
    const { endpoint: e, secret: old } = await w.endpoint(org, r.url);
    const fresh = (await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/rotate-secret`)).body.secret as string;
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the test event", () => r.accepted().length === 1);
    const got = r.accepted()[0]!;
    expect(String(got.headers["webhook-signature"]).split(" ")).toHaveLength(2);
    expect(verified(got, fresh)).toMatchObject({ event: "webhook.test" });
    expect(verified(got, old)).toMatchObject({ event: "webhook.test" });
    // Once the grace has passed, only the new secret signs.
    await w.db.query(`update webhook_endpoint set previous_secret_until = now() - interval '1 second' where id = $1`, [e.id]);
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the second test event", () => r.accepted().length === 2);
    const second = r.accepted()[1]!;
    expect(verified(second, fresh)).toMatchObject({ event: "webhook.test" });
    expect(() => verified(second, old)).toThrow();

    // A secret sealed under another key cannot sign: the attempt says so, and a rotation mends it.
    await w.db.query(`update webhook_endpoint set secret = $2 where id = $1`, [e.id, "v1:" + Buffer.alloc(48, 1).toString("base64")]);
    const stuck = (await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body.messageId as string;
    const [unreadable] = await w.attemptsOf(org, e.id, 3);
    expect(unreadable).toMatchObject({ messageId: stuck, success: false, statusCode: null, error: "the endpoint's signing secret cannot be read (was SANDBAR_ENCRYPTION_KEY changed?); rotate the secret" });
    expect(r.got).toHaveLength(2);
    // The unreadable one is now the previous secret (within its grace): the new one signs alone.
    const mended = (await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/rotate-secret`)).body.secret as string;
    await r.until("the retry after the rotation", () => r.accepted().some((g) => g.id === stuck));
    const retried = r.accepted().find((g) => g.id === stuck)!;
    expect(String(retried.headers["webhook-signature"]).split(" ")).toHaveLength(1);
    expect(verified(retried, mended)).toMatchObject({ event: "webhook.test" });
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });
});
