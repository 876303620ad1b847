import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { AuditService } from "@sandbar/protocol/gen/sandbar/control/v1/audit_pb.js";
import { OrganizationRoleService, UpdateRoleRequestSchema } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { create } from "@bufbuild/protobuf";
import { routeOf } from "@sandbar/protocol";
import { contextFor, newCall } from "../call/call.ts";
import { AuditRecorder } from "./recorder.ts";
import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

// The audit log on a real server (embedded PostgreSQL, real sockets): calls made over REST and
// gRPC with API keys and JWTs from an independent issuer, then read back through the audit routes
// and straight from the table. Nothing is mocked.

describe("audit log", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;
  let adminOrg: string;
  const jwt = (sub: string) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: true, name: sub });
  const inOrg = (id: string) => ({ "x-sandbar-organization-id": id });
  const audit = (token: string, org: string, query = "", headers: Record<string, string> = {}) => api(t.url, token, "GET", `/audit/organizations/${org}${query}`, undefined, headers);

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    t = await startTestServer({ settings: issuerSettings(idp) });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    adminOrg = (await db.query(`select organization_id from api_key where user_id = 'sandbar-admin' limit 1`)).rows[0].organization_id;
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  async function newOrg(sub: string): Promise<string> {
    const res = await api(t.url, await jwt(sub), "POST", "/organizations", { name: `${sub}'s team`, defaultRegionId: "local" });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    return res.body.id;
  }

  it("records a key-authenticated call with actor, key, address, user agent, source, target and body", async () => {
    const headers = { "user-agent": "audit-test/1.0", "x-daytona-source": "sdk-typescript" };
    const created = await api(t.url, t.adminKey, "POST", "/api-keys", { name: "audited-key", permissions: ["write:sandboxes"] }, headers);
    expect(created.status).toBe(201);
    const list = await audit(t.adminKey, adminOrg, "?targetId=audited-key");
    expect(list.status).toBe(200);
    expect(list.body).toMatchObject({ total: 1, page: 1, totalPages: 1 });
    expect(list.body.items[0]).toMatchObject({
      actorId: "sandbar-admin",
      actorApiKeyPrefix: t.adminKey.slice(0, 3),
      actorApiKeySuffix: t.adminKey.slice(-3),
      organizationId: adminOrg,
      action: "create",
      targetType: "api_key",
      targetId: "audited-key",
      statusCode: 201,
      errorMessage: null,
      ipAddress: "127.0.0.1",
      userAgent: "audit-test/1.0",
      source: "sdk-typescript",
      metadata: { protocol: "rest", body: { name: "audited-key", permissions: ["write:sandboxes"] } },
    });
    expect(Date.now() - Date.parse(list.body.items[0].createdAt)).toBeLessThan(60_000);
    // X-Sandbar-Source is the same header in this API's spelling.
    await api(t.url, t.adminKey, "DELETE", "/api-keys/audited-key", undefined, { "x-sandbar-source": "cli" });
    const deleted = await audit(t.adminKey, adminOrg, "?targetId=audited-key&action=delete");
    expect(deleted.body.items[0]).toMatchObject({ statusCode: 204, source: "cli", targetType: "api_key" });
  });

  it("records a failed call with its status and message, and a refused input as 400", async () => {
    expect((await api(t.url, t.adminKey, "DELETE", "/api-keys/no-such-key")).status).toBe(404);
    const missing = await audit(t.adminKey, adminOrg, "?targetId=no-such-key");
    expect(missing.body.items[0]).toMatchObject({ action: "delete", statusCode: 404, errorMessage: "API key not found" });
    expect((await api(t.url, t.adminKey, "POST", "/api-keys", { name: "", permissions: [] })).status).toBe(400);
    const refused = await audit(t.adminKey, adminOrg, "?action=create&targetType=api_key&limit=1");
    expect(refused.body.items[0]).toMatchObject({ statusCode: 400, errorMessage: expect.stringContaining("name") });
    // A call its caller may not make never reaches the log (the guard refuses it first), nor do reads.
    const before = (await db.query(`select count(*)::int as n from audit_log`)).rows[0].n;
    expect((await api(t.url, "sbr_not-a-key", "POST", "/api-keys", { name: "x" })).status).toBe(401);
    expect((await api(t.url, t.adminKey, "GET", "/api-keys")).status).toBe(200);
    expect((await db.query(`select count(*)::int as n from audit_log`)).rows[0].n).toBe(before);
  });

  it("records a signed-in person's calls in the organization they act on", async () => {
    const org = await newOrg("ada");
    const ada = await jwt("ada");
    const role = await api(t.url, ada, "POST", `/organizations/${org}/roles`, { name: "Readers", description: "read", permissions: ["read:volumes"] }, { "user-agent": "browser/1" });
    expect(role.status).toBe(201);
    const list = await audit(ada, org);
    expect(list.status).toBe(200);
    // Newest first: the role, then the organization itself (created outside any organization: its own).
    expect(list.body.items.map((e: { action: string; targetType: string }) => `${e.action} ${e.targetType}`)).toEqual(["create organization_role", "create organization"]);
    const [roleEntry, orgEntry] = list.body.items;
    expect(roleEntry).toMatchObject({ actorId: "ada", actorEmail: "ada@example.test", actorApiKeyPrefix: null, actorApiKeySuffix: null, organizationId: org, targetId: role.body.id, statusCode: 201, userAgent: "browser/1" });
    expect(orgEntry).toMatchObject({ actorId: "ada", organizationId: org, targetId: org, statusCode: 201, metadata: { body: { name: "ada's team", defaultRegionId: "local" } } });
  });

  it("never records secrets: key values, OpenTelemetry header values, registry passwords, environment values", async () => {
    const org = await newOrg("sam");
    const sam = await jwt("sam");
    const key = await api(t.url, sam, "POST", "/api-keys", { name: "sam-key", permissions: ["write:sandboxes", "write:registries"] }, inOrg(org));
    expect(key.status).toBe(201);
    const otel = await api(t.url, sam, "PUT", `/organizations/${org}/otel-config`, { endpoint: "https://otel.example.test", headers: { authorization: "Bearer otel-s3cret-value" } });
    expect(otel.status).toBe(204);
    // The registry create is recorded without its password, under the id it made.
    const registry = await api(t.url, key.body.value, "POST", "/docker-registry", { name: "r", url: "https://r.example.test", username: "robot", password: "registry-s3cret-value", project: "p" });
    expect(registry.status).toBe(201);
    // A refused create (cpu out of range) still records its body, without the environment.
    const sandbox = await api(t.url, key.body.value, "POST", "/sandbox", { env: { API_TOKEN: "env-s3cret-value" }, labels: { team: "x" }, cpu: 1000 });
    expect(sandbox.status).toBe(400);

    const rows = (await db.query(`select * from audit_log where organization_id = $1`, [org])).rows;
    const text = JSON.stringify(rows);
    for (const secret of [key.body.value, "otel-s3cret-value", "registry-s3cret-value", "env-s3cret-value"]) expect(text).not.toContain(secret);
    // What is not secret is there: the entries prove they hold the bodies.
    const byAction = new Map(rows.map((r) => [`${r.action} ${r.target_type}`, r]));
    expect(byAction.get("update_otel_config organization")?.metadata.body).toEqual({ organizationId: org, config: { endpoint: "https://otel.example.test" } });
    expect(byAction.get("create docker_registry")?.metadata.body).toMatchObject({ name: "r", username: "robot" });
    expect(byAction.get("create docker_registry")).toMatchObject({ status_code: 201, target_id: registry.body.id });
    expect(byAction.get("create sandbox")?.metadata.body).toMatchObject({ labels: { team: "x" }, cpu: 1000 });
    expect(byAction.get("create sandbox")?.metadata.body.env).toBeUndefined();
    // The key is named by the prefix and suffix the reference keeps, never by its value.
    expect(byAction.get("create docker_registry")).toMatchObject({ actor_api_key_prefix: key.body.value.slice(0, 3), actor_api_key_suffix: key.body.value.slice(-3) });
  });

  it("filters by actor, action, target and time, and pages by number and by cursor", async () => {
    const org = await newOrg("pat");
    const pat = await jwt("pat");
    for (let i = 0; i < 7; i++) expect((await api(t.url, pat, "POST", "/api-keys", { name: `k${i}`, permissions: [] }, inOrg(org))).status).toBe(201);
    expect((await api(t.url, pat, "DELETE", "/api-keys/k3", undefined, inOrg(org))).status).toBe(204);

    const all = await audit(pat, org, "?actorId=pat&action=create&targetType=api_key");
    expect(all.body.total).toBe(7);
    expect(all.body.items.map((e: { targetId: string }) => e.targetId)).toEqual(["k6", "k5", "k4", "k3", "k2", "k1", "k0"]);
    expect((await audit(pat, org, "?actorEmail=pat@example.test")).body.total).toBe(9); // the organization, 7 keys, 1 delete
    expect((await audit(pat, org, "?targetId=k3")).body.items.map((e: { action: string }) => e.action)).toEqual(["delete", "create"]);
    expect((await audit(pat, org, "?actorId=someone-else")).body).toMatchObject({ items: [], total: 0, totalPages: 0 });

    // Page numbers: page 2 of 3 entries.
    const page2 = await audit(pat, org, "?action=create&targetType=api_key&limit=3&page=2");
    expect(page2.body).toMatchObject({ total: 7, page: 2, totalPages: 3 });
    expect(page2.body.items.map((e: { targetId: string }) => e.targetId)).toEqual(["k3", "k2", "k1"]);

    // The cursor walks every entry once, newest first, even while new entries arrive.
    const seen: string[] = [];
    let token: string | undefined;
    let pages = 0;
    do {
      const res = await audit(pat, org, `?action=create&targetType=api_key&limit=3${token ? `&nextToken=${encodeURIComponent(token)}` : ""}`);
      expect(res.status).toBe(200);
      seen.push(...res.body.items.map((e: { targetId: string }) => e.targetId));
      token = res.body.nextToken ?? undefined;
      if (pages++ === 0) expect((await api(t.url, pat, "POST", "/api-keys", { name: "late", permissions: [] }, inOrg(org))).status).toBe(201);
    } while (token);
    expect(seen).toEqual(["k6", "k5", "k4", "k3", "k2", "k1", "k0"]);
    expect(pages).toBe(3);

    // Time range, inclusive on createdAt.
    const entries = (await audit(pat, org, "?action=create&targetType=api_key")).body.items as Array<{ targetId: string; createdAt: string }>;
    const k2 = entries.find((e) => e.targetId === "k2")!;
    const k4 = entries.find((e) => e.targetId === "k4")!;
    const ranged = await audit(pat, org, `?action=create&targetType=api_key&from=${k2.createdAt}&to=${k4.createdAt}`);
    expect(ranged.body.items.map((e: { targetId: string }) => e.targetId)).toEqual(["k4", "k3", "k2"]);
    expect((await audit(pat, org, `?from=${new Date(Date.now() + 3600_000).toISOString()}`)).body.total).toBe(0);
  });

  it("answers bad queries with 400 and the reference's messages", async () => {
    const cases: Array<[string, string]> = [
      ["?limit=0", "limit must not be less than 1"],
      ["?limit=201", "limit must not be greater than 200"],
      ["?page=0", "page must not be less than 1"],
      ["?limit=abc", "limit must be a number"], ["?limit=1.5", "limit must be an integer number"],
      ["?from=yesterday", "from must be a valid ISO 8601 date string"],
      ["?nextToken=not-a-token", "Invalid nextToken provided: not a token this list handed out"],
      [`?nextToken=${Buffer.from(JSON.stringify(["x", "y"])).toString("base64url")}`, "Invalid nextToken provided: its position is malformed"],
      [
        "?page=51&limit=200",
        "Offset-based pagination not supported for page 51 with limit 200. Please use cursor-based pagination with nextToken parameter instead.",
      ],
    ];
    for (const [query, message] of cases) {
      const res = await audit(t.adminKey, adminOrg, query);
      expect(res.body, query).toMatchObject({ statusCode: 400, error: "Bad Request", message });
    }
    expect((await api(t.url, t.adminKey, "GET", "/admin/audit?organizationId=nope")).body).toMatchObject({ statusCode: 400, message: "organizationId must be a UUID" });
  });

  it("needs read:audit_logs, and shows no other organization's entries", async () => {
    const org = await newOrg("max");
    const max = await jwt("max");
    const narrow = await api(t.url, max, "POST", "/api-keys", { name: "narrow", permissions: ["write:sandboxes"] }, inOrg(org));
    const auditor = await api(t.url, max, "POST", "/api-keys", { name: "auditor", permissions: ["read:audit_logs"] }, inOrg(org));
    expect(await audit(narrow.body.value, org)).toMatchObject({ status: 403, body: { message: "Access denied" } });
    const seen = await audit(auditor.body.value, org);
    expect(seen.status).toBe(200);
    expect(new Set(seen.body.items.map((e: { organizationId: string }) => e.organizationId))).toEqual(new Set([org]));

    // A member without the Auditor role is refused; once given it, allowed.
    const other = await newOrg("nia");
    const nia = await jwt("nia");
    const inv = await api(t.url, nia, "POST", `/organizations/${other}/invitations`, { email: "max@example.test", role: "member", assignedRoleIds: [] });
    expect((await api(t.url, max, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    expect(await audit(max, other)).toMatchObject({ status: 403, body: { message: "Access denied" } });
    const roles = (await api(t.url, nia, "GET", `/organizations/${other}/roles`)).body as Array<{ id: string; name: string }>;
    const auditorRole = roles.find((r) => r.name === "Auditor")!;
    expect((await api(t.url, nia, "POST", `/organizations/${other}/users/max/access`, { role: "member", assignedRoleIds: [auditorRole.id] })).status).toBe(200);
    const asAuditor = await audit(max, other);
    expect(asAuditor.status).toBe(200);
    // The invitation accepted by max is in nia's organization's log (the invitation names it).
    expect(asAuditor.body.items.map((e: { action: string; actorId: string }) => `${e.actorId} ${e.action}`)).toEqual(
      expect.arrayContaining(["nia update_access", "max accept", "nia create"]),
    );

    // Another organization's log is a 404, whatever the credentials, and its id unknown too.
    expect(await audit(auditor.body.value, other)).toMatchObject({ status: 404, body: { message: `Organization with ID ${other} not found` } });
    expect((await audit(await jwt("nia"), org)).status).toBe(404);
    expect((await audit(t.adminKey, org)).status).toBe(404);
    expect((await audit(max, randomUUID())).status).toBe(404);
  });

  it("gives the operator every organization's entries at /admin/audit, and no one else", async () => {
    const org = await newOrg("oli");
    const all = await api(t.url, t.adminKey, "GET", "/admin/audit?limit=200");
    expect(all.status).toBe(200);
    const orgs = new Set(all.body.items.map((e: { organizationId: string }) => e.organizationId));
    expect(orgs.has(org) && orgs.has(adminOrg)).toBe(true);
    const one = await api(t.url, t.adminKey, "GET", `/admin/audit?organizationId=${org}`);
    expect(one.body.items.map((e: { organizationId: string }) => e.organizationId)).toEqual([org]);
    expect((await api(t.url, await jwt("oli"), "GET", "/admin/audit")).status).toBe(403);
    const scoped = await api(t.url, t.adminKey, "POST", "/api-keys", { name: "scoped-admin", permissions: ["read:audit_logs"] });
    expect((await api(t.url, scoped.body.value, "GET", "/admin/audit")).status).toBe(403);
  });

  it("records gRPC calls the same way and serves the list over gRPC", async () => {
    const transport = createGrpcTransport({ baseUrl: t.url });
    const headers = { authorization: `Bearer ${t.adminKey}`, "user-agent": "grpc-test/2", "x-sandbar-source": "grpc-client" };
    await createClient(ApiKeyService, transport).createApiKey({ name: "over-grpc", permissions: [Permission.WRITE_SANDBOXES] }, { headers });
    const logs = createClient(AuditService, transport);
    const page = await logs.listAuditLogs({ organizationId: adminOrg, targetId: "over-grpc" }, { headers });
    expect(page.total).toBe(1);
    const [entry] = page.items;
    expect(entry).toMatchObject({ action: "create", targetType: "api_key", targetId: "over-grpc", statusCode: 201, ipAddress: "127.0.0.1", source: "grpc-client", actorId: "sandbar-admin" });
    expect(entry!.userAgent).toContain("grpc-test/2");
    expect(entry!.metadata).toMatchObject({ protocol: "grpc", body: { name: "over-grpc" } });
    await expect(logs.listAuditLogs({ organizationId: randomUUID() }, { headers })).rejects.toMatchObject({ code: 5 });
    // A failed gRPC call is recorded with the HTTP status its code maps to.
    await expect(createClient(ApiKeyService, transport).deleteApiKey({ name: "never-there" }, { headers })).rejects.toMatchObject({ code: 5 });
    const failed = await logs.listAuditLogs({ organizationId: adminOrg, targetId: "never-there" }, { headers });
    expect(failed.items[0]).toMatchObject({ action: "delete", statusCode: 404, errorMessage: "API key not found", metadata: { protocol: "grpc" } });
  });

  it("records each state-changing call once, in place and end to end (its cost is bench/audit's figure)", async () => {
    // The recorder's own work on a real update (a role's every field replaced), against the
    // server's database: what every state-changing call pays on top of its handler.
    const org = await newOrg("kim");
    const kim = await jwt("kim");
    const role = (await api(t.url, kim, "POST", `/organizations/${org}/roles`, { name: "R", description: "d", permissions: ["read:volumes"] })).body.id as string;
    const method = OrganizationRoleService.method.updateRole;
    const input = create(UpdateRoleRequestSchema, { organizationId: org, roleId: role, name: "R", description: "d", permissions: [Permission.READ_VOLUMES] });
    const recorder = new AuditRecorder(t.server.orm, () => {});
    const call = newCall({ headers: { "user-agent": "bench" }, socket: { remoteAddress: "127.0.0.1" } });
    call.admission = { route: routeOf(method), auth: { principal: { kind: "jwt", userId: "kim", email: "kim@example.test", systemRole: "user" }, organizationId: org } };
    const ctx = contextFor(call, method, new AbortController().signal);
    for (let i = 0; i < 300; i++) {
      const complete = await recorder.begin(method, routeOf(method), input, ctx);
      await complete({ result: { id: role, organizationId: org } });
    }
    for (let i = 0; i < 100; i++) {
      expect((await api(t.url, kim, "PUT", `/organizations/${org}/roles/${role}`, { name: "R", description: "d", permissions: ["read:volumes"] })).status).toBe(200);
    }
    expect((await db.query(`select count(*)::int as n from audit_log where target_id = $1 and action = 'update' and status_code = 200`, [role])).rows[0].n).toBe(400);
  });


  it("leaves toolbox calls out unless SANDBAR_AUDIT_TOOLBOX is on", async () => {
    const sandbox = randomUUID();
    const res = await api(t.url, t.adminKey, "POST", `/toolbox/${sandbox}/toolbox/files/folder?path=/tmp/x&mode=755`);
    expect(res.status).toBe(404);
    expect((await db.query(`select count(*)::int as n from audit_log where target_id = $1`, [sandbox])).rows[0].n).toBe(0);
  });
});

describe("audit log: toolbox switch, retention and abandoned entries", () => {
  let t: TestServer;
  let db: pg.Client;

  beforeAll(async () => {
    t = await startTestServer({ settings: { auditToolbox: true, auditRetentionDays: 7, timerTickMs: 100 } });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
  });

  it("records toolbox calls with SANDBAR_AUDIT_TOOLBOX=true, on the sandbox, without passwords", async () => {
    const sandbox = randomUUID();
    const clone = { url: "https://x-access-token:url-s3cret-value@git.example.test/r.git", path: "/tmp/r", username: "u", password: "git-s3cret-value" };
    expect((await api(t.url, t.adminKey, "POST", `/toolbox/${sandbox}/toolbox/git/clone`, clone)).status).toBe(404);
    expect((await api(t.url, t.adminKey, "GET", `/toolbox/${sandbox}/toolbox/files?path=/`)).status).toBe(404);
    const rows = (await db.query(`select * from audit_log where target_id = $1`, [sandbox])).rows;
    expect(rows).toHaveLength(1); // the read is not recorded
    expect(rows[0]).toMatchObject({ action: "toolbox_git_clone_repository", target_type: "sandbox", status_code: 404 });
    // A credential written into a URL is masked too.
    expect(rows[0].metadata.body).toMatchObject({ url: "https://***@git.example.test/r.git", username: "u", path: "/tmp/r" });
    expect(JSON.stringify(rows)).not.toContain("git-s3cret-value");
    expect(JSON.stringify(rows)).not.toContain("url-s3cret-value");
  });

  it("records a real sandbox's toolbox calls with their outcome, streams included", { timeout: 120_000 }, async () => {
    const created = await api(t.url, t.adminKey, "POST", "/sandbox", { labels: { suite: "audit" } });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const id = created.body.id as string;
    try {
      const exec = await api(t.url, t.adminKey, "POST", `/toolbox/${id}/toolbox/process/execute`, { command: "echo audited" });
      expect(exec.body).toMatchObject({ exitCode: 0 });
      // A bulk download is a server stream: its entry is completed when the stream ends. (A
      // single file's GET is a read: not recorded.)
      const res = await fetch(`${t.url}/api/toolbox/${id}/toolbox/files/bulk-download`, {
        method: "POST",
        headers: { authorization: `Bearer ${t.adminKey}`, "content-type": "application/json" },
        body: JSON.stringify({ paths: ["/etc/hostname"] }),
      });
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("hostname");
      expect((await api(t.url, t.adminKey, "GET", `/toolbox/${id}/toolbox/files/download?path=/etc/hostname`)).status).toBe(200);
      const rows = (await db.query(`select action, status_code, metadata from audit_log where target_id = $1 and target_type = 'sandbox' order by created_at`, [id])).rows;
      expect(rows.map((r) => `${r.action} ${r.status_code}`)).toEqual(["create 200", "toolbox_execute_command 200", "toolbox_bulk_download_files 200"]);
      expect(rows[1].metadata.body).toMatchObject({ command: "echo audited" });
    } finally {
      expect((await api(t.url, t.adminKey, "DELETE", `/sandbox/${id}`)).status).toBe(200);
    }
  });

  it("deletes entries past the retention period and closes entries a crash left pending", async () => {
    const ids = { old: randomUUID(), recent: randomUUID(), abandoned: randomUUID(), running: randomUUID() };
    const insert = (id: string, age: string, status: number | null) =>
      db.query(`insert into audit_log (id, actor_id, action, status_code, created_at) values ($1, 'x', 'create', $2, now() - $3::interval)`, [id, status, age]);
    await insert(ids.old, "8 days", 201);
    await insert(ids.recent, "6 days", 201);
    await insert(ids.abandoned, "31 minutes", null);
    await insert(ids.running, "1 minute", null);
    const deadline = Date.now() + 10_000;
    let rows: Array<{ id: string; status_code: number | null }> = [];
    while (Date.now() < deadline) {
      rows = (await db.query(`select id, status_code from audit_log where id = any($1::uuid[])`, [Object.values(ids)])).rows;
      if (rows.length === 3 && rows.some((r) => r.id === ids.abandoned && r.status_code === 0)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const byId = new Map(rows.map((r) => [r.id, r.status_code]));
    expect(byId.has(ids.old)).toBe(false);
    expect(byId.get(ids.recent)).toBe(201);
    expect(byId.get(ids.abandoned)).toBe(0);
    expect(byId.get(ids.running)).toBe(null);
  });
});
