import pg from "pg";
import { Webhook } from "standardwebhooks";
import { afterAll, beforeAll, expect } from "vitest";
import { eventually } from "../../../../protocol/src/testing/eventually.ts";
import { issuerSettings, TestIssuer } from "../../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../../testing/server.ts";
import type { WebhookSettings } from "../settings.ts";
import { Receiver, type Received } from "./receiver.ts";
import type { UntypedJson } from "../../casts.ts";

// Webhooks end to end on a real server (embedded PostgreSQL) with real sandboxes, delivering to
// real HTTP receivers on 127.0.0.1 (so private destinations are allowed here). Polling is set to an
// hour, longer than any test may take: every delivery and retry is woken by PostgreSQL
// notifications and the worker's due-time timer alone, so a delivery seen at all proves them.

export const SETTINGS: WebhookSettings = { allowPrivate: true, retryDelaysMs: [150, 300], timeoutMs: 3000, pollMs: 3_600_000, disableAfterMs: 0, concurrency: 8 };

export const base = (org: string) => `/webhooks/organizations/${org}/endpoints`;

/** The event a request carries, after checking its signature with the standardwebhooks verifier. */
export function verified(r: Received, secret: string): Record<string, unknown> {
  return new Webhook(secret).verify(r.body, r.headers as Record<string, string>) as Record<string, unknown>;
}

export interface WebhookSuite {
  /** The server, its database client and issuer: set once beforeAll has run. */
  readonly t: TestServer;
  readonly db: pg.Client;
  jwt(sub: string): Promise<string>;
  /** A receiver closed after the file's tests. */
  receiver(host?: string): Promise<Receiver>;
  /** The admin key's organization (the bootstrap "Default" one). */
  adminOrg(server?: TestServer): Promise<string>;
  endpoint(org: string, url: string, extra?: Record<string, unknown>, token?: string): Promise<{ endpoint: { id: string; url: string; eventTypes: string[]; enabled: boolean }; secret: string }>;
  /** The endpoint's attempts (newest first), once at least `n` are recorded. */
  attemptsOf(org: string, id: string, n: number, server?: TestServer): Promise<Array<Record<string, UntypedJson>>>;
}

/** One server per test file (`SETTINGS` with `overrides`): registers its start and stop with the file's hooks. */
export function webhookSuite(overrides: Partial<WebhookSettings> = {}): WebhookSuite {
  const idp = new TestIssuer();
  let t: TestServer | undefined;
  let db: pg.Client | undefined;
  const receivers: Receiver[] = [];
  const server = () => {
    if (!t) throw new Error("the webhook suite's server is not started yet");
    return t;
  };

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    t = await startTestServer({ settings: { ...issuerSettings(idp), webhooks: { ...SETTINGS, ...overrides } } });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    for (const r of receivers) await r.close();
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  return {
    get t() {
      return server();
    },
    get db() {
      if (!db) throw new Error("the webhook suite's database is not connected yet");
      return db;
    },
    jwt: (sub) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: true, name: sub }),
    async receiver(host) {
      const r = await new Receiver().start(host);
      receivers.push(r);
      return r;
    },
    async adminOrg(s = server()) {
      const orgs = (await api(s.url, s.adminKey, "GET", "/organizations")).body as Array<{ id: string }>;
      expect(orgs).toHaveLength(1);
      return orgs[0]!.id;
    },
    async endpoint(org, url, extra = {}, token = server().adminKey) {
      const res = await api(server().url, token, "POST", base(org), { url, ...extra });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      return res.body;
    },
    async attemptsOf(org, id, n, s = server()) {
      let items: Array<Record<string, UntypedJson>> = [];
      await eventually(`${n} attempts of endpoint ${id}`, async () => {
        const body = (await api(s.url, s.adminKey, "GET", `${base(org)}/${id}/attempts`)).body;
        items = body.items;
        return body.total >= n;
      });
      return items;
    },
  };
}
