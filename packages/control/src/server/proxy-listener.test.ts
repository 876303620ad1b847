/**
 * PROXY protocol on a real control server (embedded PostgreSQL, real sockets): 127.0.0.1 plays the
 * load balancer (SANDBAR_PROXY_PROTOCOL_FROM=127.0.0.1/32); clients connect from other loopback
 * addresses (127.0.0.0/8 is all local), which are not allowed to state an address. What the
 * header states must be the client address of REST, gRPC (h2c) and WebSocket upgrades: the
 * rate limiter's key (failed-authentication counter) and the audit record's address.
 */
import { request } from "node:http";
import { connect, type Socket } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../testing/server.ts";
import { proxyV1, proxyV2 } from "./testing/proxy-headers.ts";
import type { UntypedJson } from "../casts.ts";

const LB = "127.0.0.1";
const BAD = "sbr_" + "0".repeat(64);

describe("PROXY protocol on the control listener", () => {
  let t: TestServer;
  let adminOrg: string;

  beforeAll(async () => {
    t = await startTestServer({
      settings: {
        proxyProtocolFrom: [`${LB}/32`],
        rateLimits: { store: "memory", windowSeconds: 60, limits: { anonymous: 0, authenticated: 0, "sandbox-create": 0, "sandbox-lifecycle": 0, "failed-auth": 3 } },
      },
    });
    const db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    adminOrg = (await db.query(`select organization_id from api_key where user_id = 'sandbar-admin' limit 1`)).rows[0].organization_id;
    await db.end();
  }, 120_000);
  afterAll(async () => {
    await t?.stop();
  });

  /** A socket from `from` to the server that writes `preface` (a PROXY header, or nothing) first. */
  function socketFrom(from: string, preface?: Buffer): Socket {
    const s = connect({ host: "127.0.0.1", port: t.server.port, localAddress: from });
    if (preface) s.write(preface);
    return s;
  }

  /** One REST call over a connection of its own that starts with `preface`. */
  function rest(from: string, preface: Buffer | undefined, verb: string, path: string, opts: { key?: string; body?: unknown; headers?: Record<string, string> } = {}) {
    const text = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const headers: Record<string, string> = { ...opts.headers, ...(opts.key ? { authorization: `Bearer ${opts.key}` } : {}), ...(text ? { "content-type": "application/json" } : {}) };
    return new Promise<{ status: number; body: UntypedJson }>((resolve, reject) => {
      const req = request({ path: `/api${path}`, method: verb, headers, createConnection: () => socketFrom(from, preface) }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const raw = Buffer.concat(chunks).toString();
          resolve({ status: res.statusCode ?? 0, body: raw ? JSON.parse(raw) : undefined });
        });
      });
      req.on("error", reject);
      req.end(text);
    });
  }

  /** Writes `bytes` from `from` and collects everything the server answers until it closes. */
  function raw(from: string, bytes: Buffer): Promise<string> {
    return new Promise((resolve, reject) => {
      const s = socketFrom(from);
      const got: Buffer[] = [];
      const timer = setTimeout(() => reject(new Error("the server did not close the connection")), 10_000);
      s.on("data", (c: Buffer) => got.push(c));
      s.on("error", () => {});
      s.on("close", () => {
        clearTimeout(timer);
        resolve(Buffer.concat(got).toString("latin1"));
      });
      s.write(bytes);
    });
  }

  const auditOf = async (targetId: string) => {
    const list = await rest(LB, proxyV2("127.0.0.1", 1, { local: true }), "GET", `/audit/organizations/${adminOrg}?targetId=${targetId}`, { key: t.adminKey });
    expect(list.status).toBe(200);
    return list.body.items as Array<{ ipAddress: string; action: string }>;
  };

  it("REST: the address a v2 header states is the rate limiter's key; the balancer's own address is not counted", async () => {
    const client = "203.0.113.7";
    for (let i = 0; i < 2; i++) expect((await rest(LB, proxyV2(client, 40000 + i), "GET", "/sandbox", { key: BAD })).status).toBe(401);
    expect((await rest(LB, proxyV2(client, 40010), "GET", "/sandbox", { key: BAD })).status).toBe(429);
    // That client is refused whatever its credentials; another client behind the same balancer is not.
    expect((await rest(LB, proxyV2(client, 40011), "GET", "/sandbox", { key: t.adminKey })).status).toBe(429);
    expect((await rest(LB, proxyV2("203.0.113.8", 40012), "GET", "/sandbox", { key: t.adminKey })).status).toBe(200);
    expect((await rest(LB, proxyV1("203.0.113.9", 40013), "GET", "/sandbox", { key: t.adminKey })).status).toBe(200);
    // The balancer's health check (LOCAL) speaks for itself: its own address, not limited.
    expect((await rest(LB, proxyV2("203.0.113.7", 1, { local: true }), "GET", "/sandbox", { key: t.adminKey })).status).toBe(200);
  });

  it("audit: the stated address is recorded (v1 IPv6, v2 IPv4); a LOCAL header records the balancer's own", async () => {
    expect((await rest(LB, proxyV1("2001:db8::7", 5000), "POST", "/api-keys", { key: t.adminKey, body: { name: "via-v1", permissions: ["write:sandboxes"] } })).status).toBe(201);
    expect((await rest(LB, proxyV2("198.51.100.10", 5001), "POST", "/api-keys", { key: t.adminKey, body: { name: "via-v2", permissions: ["write:sandboxes"] } })).status).toBe(201);
    expect((await rest(LB, proxyV2("198.51.100.11", 5002, { local: true }), "POST", "/api-keys", { key: t.adminKey, body: { name: "via-local", permissions: ["write:sandboxes"] } })).status).toBe(201);
    expect((await auditOf("via-v1")).map((e) => e.ipAddress)).toEqual(["2001:db8::7"]);
    expect((await auditOf("via-v2")).map((e) => e.ipAddress)).toEqual(["198.51.100.10"]);
    expect((await auditOf("via-local")).map((e) => e.ipAddress)).toEqual(["127.0.0.1"]);
  });

  it("gRPC over h2c: the stated address is the call's client address (audit)", async () => {
    const transport = createGrpcTransport({ baseUrl: `http://127.0.0.1:${t.server.port}`, nodeOptions: { createConnection: () => socketFrom(LB, proxyV2("192.0.2.44", 6000)) } });
    const made = await createClient(ApiKeyService, transport).createApiKey({ name: "via-grpc", permissions: [Permission.WRITE_SANDBOXES] }, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(made.name).toBe("via-grpc");
    expect((await auditOf("via-grpc")).map((e) => e.ipAddress)).toEqual(["192.0.2.44"]);
  });

  it("WebSocket upgrades: failed authentications are counted against the stated address", async () => {
    const client = "203.0.113.30";
    const upgrade = (port: number) =>
      raw(LB, Buffer.concat([
        proxyV2(client, port),
        Buffer.from(
          `GET /api/toolbox/sbx-none/toolbox/process/pty/x/connect HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n` +
            `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer ${BAD}\r\n\r\n`,
        ),
      ]));
    expect(await upgrade(7000)).toMatch(/^HTTP\/1\.1 401 /);
    expect(await upgrade(7001)).toMatch(/^HTTP\/1\.1 401 /);
    expect(await upgrade(7002)).toMatch(/^HTTP\/1\.1 429 /);
    // The same client over REST is refused too: one counter per address, whatever the protocol.
    expect((await rest(LB, proxyV2(client, 7003), "GET", "/sandbox", { key: t.adminKey })).status).toBe(429);
  });

  it("a peer not in the list cannot state an address: its PROXY header is HTTP garbage (400, closed)", async () => {
    const from = "127.0.0.2";
    for (const header of [proxyV2("203.0.113.99", 1), proxyV1("203.0.113.99", 1)]) {
      const answer = await raw(from, Buffer.concat([header, Buffer.from("GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n")]));
      expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      expect(answer).toContain('"message":"Malformed HTTP request"');
    }
    // Its own calls carry its own address.
    expect((await rest(from, undefined, "POST", "/api-keys", { key: t.adminKey, body: { name: "direct", permissions: ["write:sandboxes"] } })).status).toBe(201);
    expect((await auditOf("direct")).map((e) => e.ipAddress)).toEqual(["127.0.0.2"]);
  });

  it("the balancer must send the header: a connection of it without one (or with a bad one) is closed unanswered", async () => {
    expect(await raw(LB, Buffer.from("GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n"))).toBe("");
    expect(await raw(LB, Buffer.from("PROXY TCP4 999.1.1.1 127.0.0.1 1 2\r\nGET /api/config HTTP/1.1\r\nHost: x\r\n\r\n"))).toBe("");
    // With one, the same request is answered.
    expect(await raw(LB, Buffer.concat([proxyV1("203.0.113.50", 1), Buffer.from("GET /api/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")]))).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
  });
});
