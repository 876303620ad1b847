import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";

// Organizations over REST on a real server: people sign in with JWTs from an independent
// issuer; the operator acts with the bootstrap admin key. Sandboxes are real (default snapshot).

describe("organizations", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;
  const jwt = (sub: string, email = `${sub}@example.test`) => idp.sign("k", { sub, email, name: sub });
  const inOrg = (id: string) => ({ "x-sandbar-organization-id": id });

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    // Sandbox timers fast: a "minute" is 50 ms, so a suspension's grace hour passes in 3 s.
    t = await startTestServer({ settings: { ...issuerSettings(idp), timerMinuteMs: 50, timerTickMs: 100 } });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  /** A new organization owned by `sub`, through the API. */
  async function newOrg(sub: string, name = "Team"): Promise<string> {
    const res = await api(t.url, await jwt(sub), "POST", "/organizations", { name, defaultRegionId: "local" });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    return res.body.id;
  }

  it("creates an organization owned by its creator, lists and reads it", async () => {
    const token = await jwt("ada");
    const res = await api(t.url, token, "POST", "/organizations", { name: "Analytical", defaultRegionId: "local" });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      name: "Analytical", createdBy: "ada", personal: false, defaultRegionId: "local", suspended: false,
      maxCpuPerSandbox: 4, maxMemoryPerSandbox: 8, maxDiskPerSandbox: 10, experimentalConfig: null, otelConfig: null,
    });
    const list = await api(t.url, token, "GET", "/organizations");
    expect(list.body.map((o: { name: string }) => o.name).sort()).toEqual(["Analytical", "Personal"]);
    expect((await api(t.url, token, "GET", `/organizations/${res.body.id}`)).body.id).toBe(res.body.id);
    expect((await db.query(`select role from organization_member where organization_id = $1 and user_id = 'ada'`, [res.body.id])).rows).toEqual([{ role: "owner" }]);
  });

  it("refuses bad input, unknown regions, API keys and an eleventh organization", async () => {
    const token = await jwt("bob");
    expect((await api(t.url, token, "POST", "/organizations", { name: "", defaultRegionId: "local" })).body.message).toMatch(/name should not be empty/);
    expect((await api(t.url, token, "POST", "/organizations", { name: "x" })).status).toBe(400);
    expect((await api(t.url, token, "POST", "/organizations", { name: "x", defaultRegionId: "mars" })).body).toMatchObject({ statusCode: 404, message: "Region not found" });
    expect((await api(t.url, t.adminKey, "POST", "/organizations", { name: "x", defaultRegionId: "local" })).status).toBe(401);
    for (let i = 0; i < 9; i++) await newOrg("bob", `Org ${i}`); // the personal one is the tenth
    expect((await api(t.url, token, "POST", "/organizations", { name: "more", defaultRegionId: "local" })).body).toMatchObject({
      statusCode: 403,
      message: "You have reached the maximum number of created organizations",
    });
  });

  it("answers 404 for an organization the caller is not in, and 403 Access denied to a member on owner routes", async () => {
    const org = await newOrg("carol");
    const dave = await jwt("dave");
    expect((await api(t.url, dave, "GET", `/organizations/${org}`)).body).toMatchObject({ statusCode: 404, message: `Organization with ID ${org} not found` });
    expect((await api(t.url, dave, "DELETE", `/organizations/${org}`)).status).toBe(404);
    expect((await api(t.url, t.adminKey, "GET", `/organizations/${org}`)).status).toBe(404); // a key of another organization
    await db.query(`insert into organization_member (organization_id, user_id, role) values ($1, 'dave', 'member')`, [org]);
    await db.query(`select pg_notify('sandbar_auth', $1)`, [JSON.stringify({ kind: "organization", organizationId: org })]);
    expect((await api(t.url, dave, "GET", `/organizations/${org}`)).status).toBe(200);
    expect((await api(t.url, dave, "DELETE", `/organizations/${org}`)).body).toMatchObject({ statusCode: 403, message: "Access denied" });
    expect((await api(t.url, dave, "PUT", `/organizations/${org}/experimental-config`, { a: 1 })).status).toBe(403);
  });

  it("sets the default region once, to a shared region", async () => {
    const carol = await jwt("carol");
    const org = await newOrg("carol");
    await db.query(`update organization set default_region_id = null where id = $1`, [org]);
    expect((await api(t.url, carol, "PATCH", `/organizations/${org}/default-region`, { defaultRegionId: "mars" })).status).toBe(404);
    expect((await api(t.url, carol, "PATCH", `/organizations/${org}/default-region`, { defaultRegionId: "local" })).status).toBe(204);
    expect((await api(t.url, carol, "PATCH", `/organizations/${org}/default-region`, { defaultRegionId: "local" })).body).toMatchObject({
      statusCode: 409,
      message: "Organization already has a default region set",
    });
  });

  it("enforces quotas on sandbox create and start, with usage that shows them", async () => {
    const erin = await jwt("erin");
    const org = await newOrg("erin");
    const h = inOrg(org);
    expect((await api(t.url, erin, "POST", "/sandbox", { cpu: 5 }, h)).body).toMatchObject({ statusCode: 400, message: expect.stringMatching(/^CPU request 5 exceeds maximum allowed per sandbox \(4\)/) });
    // The operator shrinks the totals; a member of the organization cannot.
    expect((await api(t.url, erin, "PATCH", `/organizations/${org}/quota`, { totalCpuQuota: 2 })).status).toBe(403);
    const q = await api(t.url, t.adminKey, "PATCH", `/organizations/${org}/quota`, { totalCpuQuota: 2, totalMemoryQuota: 2, maxDiskPerSandbox: 3 });
    expect(q.status).toBe(200);
    expect(q.body.maxDiskPerSandbox).toBe(3);
    expect((await api(t.url, t.adminKey, "PATCH", `/organizations/${org}/quota`, { totalCpuQuota: -1 })).status).toBe(400);

    const a = await api(t.url, erin, "POST", "/sandbox", { cpu: 2, memory: 1 }, h);
    expect(a.status, JSON.stringify(a.body)).toBe(200);
    expect(a.body.target).toBe("local");
    expect((await api(t.url, erin, "POST", "/sandbox", { cpu: 1 }, h)).body).toMatchObject({ statusCode: 403, message: expect.stringMatching(/^Total CPU limit exceeded\. Maximum allowed: 2\./) });
    const usage = (await api(t.url, erin, "GET", `/organizations/${org}/usage`)).body;
    expect(usage.regionUsage).toEqual([
      expect.objectContaining({ regionId: "local", sandboxClass: "container", totalCpuQuota: 2, currentCpuUsage: 2, totalMemoryQuota: 2, currentMemoryUsage: 1, totalDiskQuota: 30, currentDiskUsage: 3 }),
    ]);
    expect(usage).toMatchObject({ totalSnapshotQuota: 30, currentSnapshotUsage: 0, totalVolumeQuota: 100 });
    expect((await api(t.url, erin, "GET", `/organizations/${org}/available-sandbox-classes`)).body).toEqual([{ regionId: "local", sandboxClass: "container", gpuAvailable: false, allowedGpuTypes: [] }]);

    // Stopped, it frees CPU and memory (not disk); another sandbox takes them; the first cannot start again.
    expect((await api(t.url, erin, "POST", `/sandbox/${a.body.id}/stop`, undefined, h)).status).toBe(200);
    const b = await api(t.url, erin, "POST", "/sandbox", { cpu: 2, memory: 1 }, h);
    expect(b.status).toBe(200);
    expect((await api(t.url, erin, "POST", `/sandbox/${a.body.id}/start`, undefined, h)).body.message).toMatch(/^Total CPU limit exceeded/);
    // An organization with sandboxes cannot be deleted.
    expect((await api(t.url, erin, "DELETE", `/organizations/${org}`)).body).toMatchObject({ statusCode: 409, message: expect.stringMatching(/still has 2 sandboxes/) });
    for (const id of [a.body.id, b.body.id]) expect((await api(t.url, erin, "DELETE", `/sandbox/${id}`, undefined, h)).status).toBe(200);
    expect((await api(t.url, erin, "DELETE", `/organizations/${org}`)).status).toBe(204);
    expect((await api(t.url, erin, "GET", `/organizations/${org}`)).status).toBe(404);
  });

  it("suspends: sandbox changes refused with the reason, running sandboxes stopped after the grace period, unsuspend restores", async () => {
    const fay = await jwt("fay");
    const org = await newOrg("fay");
    const h = inOrg(org);
    const sb = await api(t.url, fay, "POST", "/sandbox", { autoStopInterval: 0 }, h);
    expect(sb.body.state).toBe("started");
    expect((await api(t.url, fay, "POST", `/organizations/${org}/suspend`, { reason: "unpaid" })).status).toBe(403); // operators only
    // Taken before the suspension: the grace is counted from a later moment on the server.
    const suspendedAt = Date.now();
    expect((await api(t.url, t.adminKey, "POST", `/organizations/${org}/suspend`, { reason: "unpaid", suspensionCleanupGracePeriodHours: 1 })).status).toBe(204);
    expect((await api(t.url, fay, "POST", "/sandbox", {}, h)).body).toMatchObject({ statusCode: 403, message: "Organization is suspended: unpaid" });
    expect((await api(t.url, fay, "GET", `/organizations/${org}`)).body).toMatchObject({ suspended: true, suspensionReason: "unpaid", suspensionCleanupGracePeriodHours: 1 });
    // Reads keep working; after one grace "hour" (60 fast minutes = 3 s), not before, the sandbox is stopped.
    expect((await api(t.url, fay, "GET", `/sandbox/${sb.body.id}`, undefined, h)).body.state).toBe("started");
    await eventually("the sandbox to be stopped", async () => (await api(t.url, fay, "GET", `/sandbox/${sb.body.id}`, undefined, h)).body.state === "stopped", 30_000);
    // Not before the grace (a lower bound: load can only lengthen it).
    expect(Date.now() - suspendedAt).toBeGreaterThanOrEqual(2900);
    expect((await api(t.url, fay, "POST", `/sandbox/${sb.body.id}/start`, undefined, h)).status).toBe(403);
    expect((await api(t.url, t.adminKey, "POST", `/organizations/${org}/unsuspend`)).status).toBe(204);
    expect((await api(t.url, fay, "GET", `/organizations/${org}`)).body).toMatchObject({ suspended: false, suspensionReason: null, suspendedAt: null });
    expect((await api(t.url, fay, "POST", `/sandbox/${sb.body.id}/start`, undefined, h)).body.state).toBe("started");
    expect((await api(t.url, fay, "DELETE", `/sandbox/${sb.body.id}`, undefined, h)).status).toBe(200);
  });

  it("refuses to delete a personal organization and lets no last owner leave", async () => {
    const gil = await jwt("gil");
    const personal = (await api(t.url, gil, "GET", "/organizations")).body[0];
    expect(personal.personal).toBe(true);
    expect((await api(t.url, gil, "DELETE", `/organizations/${personal.id}`)).body).toMatchObject({ statusCode: 403, message: "Cannot delete personal organization" });
    const org = await newOrg("gil");
    expect((await api(t.url, gil, "POST", `/organizations/${org}/leave`)).body).toMatchObject({ statusCode: 403, message: `Organization with ID ${org} must have at least one owner` });
    // A member leaves, and their keys in it go with them.
    await db.query(`insert into organization_member (organization_id, user_id, role) values ($1, 'hal', 'member')`, [org]).catch(async () => {
      await api(t.url, await jwt("hal"), "GET", "/organizations"); // provisions hal
      await db.query(`insert into organization_member (organization_id, user_id, role) values ($1, 'hal', 'member')`, [org]);
    });
    const hal = await jwt("hal");
    const key = await api(t.url, hal, "POST", "/api-keys", { name: "k", permissions: [] }, inOrg(org));
    expect(key.status).toBe(201);
    expect((await api(t.url, key.body.value, "GET", "/api-keys/current")).status).toBe(200);
    expect((await api(t.url, hal, "POST", `/organizations/${org}/leave`)).status).toBe(204);
    expect((await api(t.url, key.body.value, "GET", "/api-keys/current")).status).toBe(401);
    expect((await api(t.url, hal, "GET", `/organizations/${org}`)).status).toBe(404);
  });

  it("keeps OpenTelemetry headers encrypted, masked for members and in clear for the operator and by sandbox token", async () => {
    const ivy = await jwt("ivy");
    const org = await newOrg("ivy");
    const url = `/organizations/${org}/otel-config`;
    expect((await api(t.url, ivy, "GET", url)).status).toBe(404);
    expect((await api(t.url, ivy, "PUT", url, { endpoint: "not a url" })).body).toMatchObject({ statusCode: 400, message: "Invalid OpenTelemetry endpoint" });
    expect((await api(t.url, ivy, "PUT", url, { endpoint: "https://otel.example.test", headers: { authorization: "Bearer s3cret", "x-a": "1", "": "x" } })).status).toBe(204);
    expect((await api(t.url, ivy, "GET", url)).body).toEqual({ endpoint: "https://otel.example.test", headers: { authorization: "******", "x-a": "******" }, organizationId: org });
    const stored = (await db.query(`select otel_config from organization where id = $1`, [org])).rows[0].otel_config;
    expect(JSON.stringify(stored)).not.toContain("s3cret");
    // A masked value sent back keeps the stored one.
    expect((await api(t.url, ivy, "PUT", url, { endpoint: "https://otel.example.test", headers: { authorization: "******", "x-a": "2" } })).status).toBe(204);
    const sb = await api(t.url, ivy, "POST", "/sandbox", {}, inOrg(org));
    const token = (await db.query(`select auth_token from sandbox where id = $1`, [sb.body.id])).rows[0].auth_token;
    const clear = await api(t.url, t.adminKey, "GET", `/organizations/otel-config/by-sandbox-auth-token/${token}`);
    expect(clear.body.headers).toEqual({ authorization: "Bearer s3cret", "x-a": "2" });
    expect((await api(t.url, ivy, "GET", `/organizations/otel-config/by-sandbox-auth-token/${token}`)).status).toBe(403);
    expect((await api(t.url, undefined, "GET", `/organizations/sandbox-identity/by-sandbox-auth-token/${token}`)).body).toEqual({ sandboxId: sb.body.id, organizationId: org });
    expect((await api(t.url, undefined, "GET", `/organizations/sandbox-identity/by-sandbox-auth-token/nope`)).status).toBe(404);
    expect((await api(t.url, ivy, "DELETE", `/sandbox/${sb.body.id}`, undefined, inOrg(org))).status).toBe(200);
    expect((await api(t.url, ivy, "DELETE", url)).status).toBe(204);
    expect((await api(t.url, ivy, "GET", url)).status).toBe(404);
  });

  it("stores experimental config as given, clears it with null, and refuses otel in it", async () => {
    const jo = await jwt("jo");
    const org = await newOrg("jo");
    const url = `/organizations/${org}/experimental-config`;
    expect((await api(t.url, jo, "PUT", url, { flags: { fast: true }, n: 3 })).status).toBe(200);
    expect((await api(t.url, jo, "GET", `/organizations/${org}`)).body.experimentalConfig).toEqual({ flags: { fast: true }, n: 3 });
    expect((await api(t.url, jo, "PUT", url, { otel: {} })).body.message).toMatch(/^OpenTelemetry configuration has moved/);
    expect((await api(t.url, jo, "PUT", url, "null")).status).toBe(200);
    expect((await api(t.url, jo, "GET", `/organizations/${org}`)).body.experimentalConfig).toBeNull();
  });
});
