import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { execIn } from "../db/exec.ts";
import { api, startTestServer } from "../testing/server.ts";
import { recordEvent } from "./index.ts";
import { base, SETTINGS, verified, webhookSuite } from "./testing/suite.ts";

// How recorded events reach the delivery worker: with their transaction, by notifications (also
// after the listening connection was lost), and by polling for what no notification announced.

const w = webhookSuite();

describe("webhook events reaching delivery", () => {
  it("records an event only with the transaction that makes the change: rolled back, nothing is sent", async () => {
    const r = await w.receiver();
    // An organization of its own: its one endpoint is the only subscriber.
    const vera = await w.jwt("vera");
    const org = (await api(w.t.url, vera, "POST", "/organizations", { name: "vera's team", defaultRegionId: "local" })).body.id as string;
    const { secret } = await w.endpoint(org, r.url, { eventTypes: ["volume.created"] }, vera);
    const volume = { id: randomUUID(), name: "v1", organizationId: org, state: "ready", createdAt: new Date().toISOString() };
    const countOf = async () => (await w.db.query(`select count(*)::int as n from webhook_message where organization_id = $1`, [org])).rows[0].n as number;
    const before = await countOf();
    // What the volumes feature will do: record inside its own transaction.
    const failed = await w.t.server.orm.em.fork().transactional(async (em) => {
      await recordEvent(execIn(em), org, "volume.created", volume);
      throw new Error("the change failed");
    }).catch((err: Error) => err.message);
    expect(failed).toBe("the change failed");
    expect((await countOf())).toBe(before);
    // Not subscribed: nothing is written at all.
    await w.t.server.orm.em.fork().transactional((em) => recordEvent(execIn(em), org, "snapshot.removed", { id: randomUUID(), name: "s", organizationId: org, removedAt: new Date().toISOString() }));
    expect((await countOf())).toBe(before);

    const id = await w.t.server.orm.em.fork().transactional((em) => recordEvent(execIn(em), org, "volume.created", volume));
    await r.until("the committed event", () => r.accepted().length === 1);
    expect(r.got.map((g) => g.id)).toEqual([id]);
    expect(verified(r.got[0]!, secret)).toEqual({ event: "volume.created", timestamp: expect.any(String), ...volume });
  });

  it("listens again after losing its PostgreSQL connection", async () => {
    const r = await w.receiver();
    const org = await w.adminOrg();
    const { endpoint: e } = await w.endpoint(org, r.url);
    const listeners = async () => (await w.db.query(`select pid from pg_stat_activity where query = 'LISTEN sandbar_webhooks'`)).rows.map((x) => x.pid as number);
    const old = await listeners();
    expect(old).toHaveLength(1);
    await w.db.query(`select pg_terminate_backend($1)`, [old[0]]);
    await eventually("the worker to listen again", async () => (await listeners()).some((pid) => pid !== old[0]));
    // Polling is an hour here, longer than the test may run: only a notification brings this event.
    await api(w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`);
    await r.until("the event after reconnecting", () => r.accepted().length === 1);
    await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
  });

  it("sends membership events: added, updated, removed", async () => {
    const r = await w.receiver();
    const [pat, sam] = [await w.jwt("pat"), await w.jwt("sam")];
    const org = (await api(w.t.url, pat, "POST", "/organizations", { name: "pat's team", defaultRegionId: "local" })).body.id as string;
    const { secret } = await w.endpoint(org, r.url, { eventTypes: ["organization.member.added", "organization.member.updated", "organization.member.removed"] }, pat);
    await api(w.t.url, sam, "GET", "/organizations");
    const DEVELOPER = "00000000-0000-0000-0000-000000000001";
    const inv = await api(w.t.url, pat, "POST", `/organizations/${org}/invitations`, { email: "sam@example.test", role: "member", assignedRoleIds: [DEVELOPER] });
    expect((await api(w.t.url, sam, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    expect((await api(w.t.url, pat, "POST", `/organizations/${org}/users/sam/access`, { role: "owner", assignedRoleIds: [] })).status).toBe(200);
    expect((await api(w.t.url, sam, "POST", `/organizations/${org}/leave`)).status).toBe(204);
    await r.until("three membership events", () => r.accepted().length === 3);
    const events = r.accepted().map((g) => verified(g, secret)).sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    expect(events.map(({ timestamp: _, ...rest }) => rest)).toEqual([
      { event: "organization.member.added", organizationId: org, userId: "sam", role: "member", assignedRoleIds: [DEVELOPER] },
      { event: "organization.member.updated", organizationId: org, userId: "sam", role: "owner", assignedRoleIds: [] },
      { event: "organization.member.removed", organizationId: org, userId: "sam" },
    ]);
  });

  it("two control processes on one database deliver each event exactly once between them, polling for what no notification announced", async () => {
    const r = await w.receiver();
    r.answer = () => 200;
    // The second process polls often; the first (a minute) relies on notifications.
    const second = await startTestServer({ databaseUrl: w.t.server.databaseUrl, adminKey: w.t.adminKey, settings: { webhooks: { ...SETTINGS, pollMs: 250 } } });
    try {
      const org = await w.adminOrg();
      const { endpoint: e } = await w.endpoint(org, r.url);
      const ids = await Promise.all(
        Array.from({ length: 40 }, async (_, i) => (await api(i % 2 ? second.url : w.t.url, w.t.adminKey, "POST", `${base(org)}/${e.id}/test`)).body.messageId as string),
      );
      await r.until("forty events", () => r.accepted().length >= 40);
      // Every delivery settled, each on its first attempt. A second send of one (both processes
      // claiming it) would have gone out alongside the first, before either was recorded.
      const deliveries = async () => (await w.db.query(`select status, attempts from webhook_delivery where endpoint_id = $1`, [e.id])).rows as Array<{ status: string; attempts: number }>;
      await eventually("forty deliveries settled", async () => (await deliveries()).filter((d) => d.status === "succeeded").length === 40);
      expect((await deliveries()).map((d) => [d.status, d.attempts])).toEqual(Array(40).fill(["succeeded", 1]));
      expect(r.got.map((g) => g.id).sort()).toEqual([...ids].sort());

      // An event whose notification was lost (queued here without one) is found by polling.
      const lost = randomUUID();
      await w.db.query(`insert into webhook_message (id, organization_id, event_type, body) values ($1, $2, 'webhook.test', '{"event":"webhook.test"}')`, [lost, org]);
      await w.db.query(`insert into webhook_delivery (id, message_id, endpoint_id) values ($1, $2, $3)`, [randomUUID(), lost, e.id]);
      await r.until("the event without a notification", () => r.accepted().some((g) => g.id === lost));
      await api(w.t.url, w.t.adminKey, "DELETE", `${base(org)}/${e.id}`);
    } finally {
      await second.stop();
    }
  });
});
