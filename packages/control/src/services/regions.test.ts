import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../auth/key-material.ts";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

describe("regions", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;
  let other: string;
  const jwt = (sub: string) => idp.sign("k", { sub, email: `${sub}@example.test`, name: sub });

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    t = await startTestServer({ settings: issuerSettings(idp) });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    other = await jwt("orla");
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  it("lists the shared local region publicly and to organizations that have a quota in it", async () => {
    expect((await api(t.url, undefined, "GET", "/shared-regions")).body).toEqual([expect.objectContaining({ id: "local", name: "local", regionType: "shared", organizationId: null })]);
    expect((await api(t.url, t.adminKey, "GET", "/regions")).body.map((r: { id: string }) => r.id)).toEqual(["local"]);
    // Shared regions are not addressable by id (the reference's rule).
    expect((await api(t.url, t.adminKey, "GET", "/regions/local")).body).toMatchObject({ statusCode: 404, message: "Region not found" });
  });

  it("creates a custom region with credentials answered once and stored as hashes", async () => {
    const res = await api(t.url, t.adminKey, "POST", "/regions", { name: "Edge-1", proxyUrl: "https://proxy.example.test", snapshotManagerUrl: "https://sm.example.test" });
    expect(res.status).toBe(201);
    expect(res.body.id).toMatch(/^edge-1_[a-z0-9]{4}$/);
    expect(res.body.proxyApiKey).toMatch(/^sbr_[0-9a-f]{64}$/);
    expect(res.body.sshGatewayApiKey ?? null).toBeNull();
    expect(res.body).toMatchObject({ snapshotManagerUsername: "sandbar", snapshotManagerPassword: expect.stringMatching(/^[0-9a-f]{32}$/) });
    const row = (await db.query(`select * from region where id = $1`, [res.body.id])).rows[0];
    expect(row.proxy_api_key_hash).toBe(hashApiKey(res.body.proxyApiKey));
    expect(JSON.stringify(row)).not.toContain(res.body.proxyApiKey);
    expect(JSON.stringify(row)).not.toContain(res.body.snapshotManagerPassword);
    const got = await api(t.url, t.adminKey, "GET", `/regions/${res.body.id}`);
    expect(got.body).toMatchObject({ name: "Edge-1", regionType: "custom", proxyUrl: "https://proxy.example.test", sshGatewayUrl: null });
    expect((await api(t.url, t.adminKey, "GET", "/regions")).body.map((r: { id: string }) => r.id)).toEqual([res.body.id, "local"]);

    // Regenerate, update, refusals.
    const again = await api(t.url, t.adminKey, "POST", `/regions/${res.body.id}/regenerate-proxy-api-key`);
    expect(again.body.apiKey).not.toBe(res.body.proxyApiKey);
    expect((await db.query(`select proxy_api_key_hash from region where id = $1`, [res.body.id])).rows[0].proxy_api_key_hash).toBe(hashApiKey(again.body.apiKey));
    expect((await api(t.url, t.adminKey, "POST", `/regions/${res.body.id}/regenerate-ssh-gateway-api-key`)).body).toMatchObject({
      statusCode: 400,
      message: "Region does not have an SSH gateway URL configured",
    });
    expect((await api(t.url, t.adminKey, "POST", `/regions/${res.body.id}/regenerate-snapshot-manager-credentials`)).body).toMatchObject({ username: "sandbar" });
    expect((await api(t.url, t.adminKey, "PATCH", `/regions/${res.body.id}`, { proxyUrl: "", sshGatewayUrl: "https://ssh.example.test" })).status).toBe(200);
    const row2 = (await db.query(`select proxy_url, proxy_api_key_hash, ssh_gateway_url from region where id = $1`, [res.body.id])).rows[0];
    expect(row2).toEqual({ proxy_url: null, proxy_api_key_hash: null, ssh_gateway_url: "https://ssh.example.test" });
    expect((await api(t.url, t.adminKey, "PATCH", `/regions/${res.body.id}`, { proxyUrl: "ftp://x" })).body.message).toBe("proxyUrl must be an http(s) URL");
    expect((await api(t.url, t.adminKey, "DELETE", `/regions/${res.body.id}`)).status).toBe(204);
    expect((await api(t.url, t.adminKey, "GET", `/regions/${res.body.id}`)).status).toBe(404);
  });

  it("checks names as the reference does and refuses duplicates with 409, even at once", async () => {
    expect((await api(t.url, t.adminKey, "POST", "/regions", { name: "no spaces" })).body.message).toBe(
      "Region name must contain only letters, numbers, underscores, periods, and hyphens",
    );
    expect((await api(t.url, t.adminKey, "POST", "/regions", { name: "x" })).body.message).toBe("Region name must be between 3 and 255 characters");
    expect((await api(t.url, t.adminKey, "POST", "/regions", { name: "local" })).body).toMatchObject({ statusCode: 409, message: "Region with name local already exists" });
    const both = await Promise.all([api(t.url, t.adminKey, "POST", "/regions", { name: "twin" }), api(t.url, t.adminKey, "POST", "/regions", { name: "twin" })]);
    expect(both.map((r) => r.status).sort()).toEqual([201, 409]);
  });

  it("needs write:regions and delete:regions, and keeps other organizations' regions invisible", async () => {
    const narrow = (await api(t.url, t.adminKey, "POST", "/api-keys", { name: "narrow", permissions: ["write:sandboxes"] })).body.value;
    expect((await api(t.url, narrow, "POST", "/regions", { name: "nope" })).body).toMatchObject({ statusCode: 403, message: "Access denied" });
    const mine = (await api(t.url, t.adminKey, "POST", "/regions", { name: "mine" })).body.id;
    expect((await api(t.url, narrow, "DELETE", `/regions/${mine}`)).status).toBe(403);
    expect((await api(t.url, narrow, "GET", "/regions")).body.map((r: { id: string }) => r.id)).toContain(mine);

    const org = (await api(t.url, other, "GET", "/organizations")).body[0].id;
    const h = { "x-sandbar-organization-id": org };
    expect((await api(t.url, other, "GET", "/regions", undefined, h)).body.map((r: { id: string }) => r.id)).toEqual(["local"]);
    for (const [verb, path] of [["GET", `/regions/${mine}`], ["PATCH", `/regions/${mine}`], ["DELETE", `/regions/${mine}`], ["POST", `/regions/${mine}/regenerate-proxy-api-key`]]) {
      expect((await api(t.url, other, verb!, path!, verb === "PATCH" ? {} : undefined, h)).status, `${verb} ${path}`).toBe(404);
    }
  });

  it("refuses to delete a region that holds sandboxes, and puts a sandbox in the region it names", async () => {
    const region = (await api(t.url, t.adminKey, "POST", "/regions", { name: "busy" })).body.id;
    const sb = await api(t.url, t.adminKey, "POST", "/sandbox", { target: "busy" });
    expect(sb.status, JSON.stringify(sb.body)).toBe(200);
    expect(sb.body.target).toBe(region);
    expect((await api(t.url, t.adminKey, "GET", `/sandbox?regions=${region}`)).status).toBe(200);
    expect((await api(t.url, t.adminKey, "DELETE", `/regions/${region}`)).body.message).toMatch(/^Cannot delete region which has sandboxes in it/);
    expect((await api(t.url, t.adminKey, "POST", "/sandbox", { target: "mars" })).body).toMatchObject({ statusCode: 404, message: "Region not found" });
    expect((await api(t.url, t.adminKey, "DELETE", `/sandbox/${sb.body.id}`)).status).toBe(200);
    expect((await api(t.url, t.adminKey, "DELETE", `/regions/${region}`)).status).toBe(204);
  });
});
