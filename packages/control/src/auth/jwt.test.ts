import { SignJWT } from "jose";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AUDIENCE, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { pgExec } from "../db/exec.ts";
import { Credentials } from "./credentials.ts";
import { JwtVerifier } from "./jwt.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");

describe("JWT verification against an independent issuer", () => {
  const idp = new TestIssuer();
  let verifier: JwtVerifier;

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k1");
    verifier = new JwtVerifier({ issuer: idp.url, audience: AUDIENCE, jwksCooldownMs: 0, jwksCacheMs: 200 });
  });
  afterAll(() => idp.stop());

  it("accepts a valid token and reads its claims", async () => {
    expect(await verifier.verify(await idp.sign("k1"))).toEqual({ sub: "ext|ada", email: "ada@example.test", emailVerified: false, name: "Ada", issuedAt: expect.any(Number) });
  });

  it("follows a key rotation: old-key tokens valid until the key is removed, new-key tokens accepted", async () => {
    const old = await idp.sign("k1");
    await idp.addKey("k2");
    const fresh = await idp.sign("k2");
    // The unknown kid makes the verifier read the JWKS again.
    await expect(verifier.verify(fresh)).resolves.toMatchObject({ sub: "ext|ada" });
    await expect(verifier.verify(old)).resolves.toMatchObject({ sub: "ext|ada" });
    idp.unpublish("k1");
    // Once the JWKS cache (200 ms here) is read again, the removed key no longer verifies.
    await eventually("the removed key to be refused", () => verifier.verify(old).then(() => false, () => true));
    await expect(verifier.verify(old)).rejects.toMatchObject({ code: 16 });
    await expect(verifier.verify(fresh)).resolves.toMatchObject({ sub: "ext|ada" });
  });

  it("refuses forged and wrong tokens", async () => {
    await idp.addKey("k2-forged", false); // a key of the attacker's, claiming a published kid
    const forgedKey = await idp.sign("k2-forged");
    const [, payload, signature] = forgedKey.split(".");
    const cases: Record<string, string> = {
      "wrong key": [b64({ alg: "RS256", kid: "k2", typ: "JWT" }), payload, signature].join("."),
      "wrong issuer": await idp.sign("k2", {}, { issuer: "https://evil.example" }),
      "wrong audience": await idp.sign("k2", {}, { audience: "https://other.example" }),
      expired: await idp.sign("k2", {}, { exp: Math.floor(Date.now() / 1000) - 120 }),
      "alg none": [b64({ alg: "none", typ: "JWT" }), payload, ""].join("."),
      "alg none with a signature": [b64({ alg: "none", kid: "k2" }), payload, signature].join("."),
      "HS256 keyed with the public key": await new SignJWT({ sub: "ext|ada" })
        .setProtectedHeader({ alg: "HS256", kid: "k2" })
        .setIssuer(idp.url)
        .setAudience(AUDIENCE)
        .setExpirationTime("5m")
        .sign(new TextEncoder().encode(JSON.stringify(idp.published[0]))),
      "no subject": await idp.sign("k2", { sub: "" }),
      garbage: "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.AAAA",
    };
    for (const [name, token] of Object.entries(cases)) {
      await expect(verifier.verify(token), name).rejects.toMatchObject({ code: 16 });
    }
  });

  it("is unavailable (not 'valid') when discovery names another issuer", async () => {
    const other = new JwtVerifier({ issuer: idp.url + "/tenant", audience: AUDIENCE });
    await expect(other.verify(await idp.sign("k2"))).rejects.toMatchObject({ code: 14 });
  });
});

describe("a server configured with an external issuer", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("a");
    t = await startTestServer({ settings: { oidc: { issuer: idp.url, clientId: "ext-cli", audience: AUDIENCE } } });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  it("advertises the external issuer and runs no built-in one", async () => {
    expect((await api(t.url, undefined, "GET", "/config")).body.oidc).toEqual({ issuer: idp.url, clientId: "ext-cli", audience: AUDIENCE });
    expect(t.server.identity.issuer).toBeUndefined();
    expect((await fetch(`${t.url}/oidc/.well-known/openid-configuration`)).status).not.toBe(200);
  });

  it("creates the user and a personal organization on first sign-in, then serves their calls", async () => {
    const token = await idp.sign("a", { sub: "ext|grace", email: "grace@example.test", name: "Grace" });
    // No organization header: authenticated, but no organization context.
    expect((await api(t.url, token, "GET", "/api-keys")).status).toBe(403);
    const user = (await db.query(`select id, email, name, role from "user" where id = 'ext|grace'`)).rows[0];
    expect(user).toEqual({ id: "ext|grace", email: "grace@example.test", name: "Grace", role: "user" });
    const orgs = (await db.query(`select o.id, o.personal, m.role from organization o join organization_member m on m.organization_id = o.id where m.user_id = 'ext|grace'`)).rows;
    expect(orgs).toEqual([{ id: expect.any(String), personal: true, role: "owner" }]);
    const org = { "x-sandbar-organization-id": orgs[0].id };
    expect((await api(t.url, token, "POST", "/api-keys", { name: "k", permissions: ["write:sandboxes"] }, org)).status).toBe(201);
    expect((await api(t.url, token, "GET", "/api-keys", undefined, org)).body.map((k: { name: string }) => k.name)).toEqual(["k"]);
    // Another organization (the bootstrap one) is not theirs.
    const other = (await db.query(`select organization_id from organization_member where user_id = 'sandbar-admin'`)).rows[0].organization_id;
    expect((await api(t.url, token, "GET", "/api-keys", undefined, { "x-sandbar-organization-id": other })).status).toBe(403);
    // A second request does not create anything again.
    await api(t.url, await idp.sign("a", { sub: "ext|grace" }), "GET", "/api-keys", undefined, org);
    expect((await db.query(`select count(*)::int as n from organization_member where user_id = 'ext|grace'`)).rows[0].n).toBe(1);
  });

  it("applies the JWT listing and deletion rules of API keys to owners and members", async () => {
    const grace = await idp.sign("a", { sub: "ext|grace", email: "grace@example.test" });
    const hopper = await idp.sign("a", { sub: "ext|hopper", email: "hopper@example.test", name: "Hopper" });
    const orgId = (await db.query(`select o.id from organization o where o.created_by = 'ext|grace' and o.personal`)).rows[0].id;
    const org = { "x-sandbar-organization-id": orgId };
    expect((await api(t.url, hopper, "GET", "/api-keys", undefined, org)).status).toBe(403); // provisioned, not a member
    await db.query(`insert into organization_member (organization_id, user_id, role) values ($1, 'ext|hopper', 'member')`, [orgId]);
    await Credentials.publish(pgExec(db), { kind: "member", organizationId: orgId, userId: "ext|hopper" }); // as membership changes do: every process re-reads it

    expect((await api(t.url, hopper, "POST", "/api-keys", { name: "h", permissions: ["write:sandboxes"] }, org)).body.message).toBe(
      "Insufficient permissions for assigning: write:sandboxes",
    );
    expect((await api(t.url, hopper, "POST", "/api-keys", { name: "h", permissions: [] }, org)).status).toBe(201);
    const names = async (token: string) => ((await api(t.url, token, "GET", "/api-keys", undefined, org)).body as Array<{ name: string; userId: string }>).map((k) => `${k.userId}/${k.name}`).sort();
    expect(await names(grace)).toEqual(["ext|grace/k", "ext|hopper/h"]);
    expect(await names(hopper)).toEqual(["ext|hopper/h"]);
    // By name, even an owner reaches only their own keys.
    expect((await api(t.url, grace, "GET", "/api-keys/h", undefined, org)).status).toBe(404);

    const del = (token: string, user: string, name: string) => api(t.url, token, "DELETE", `/api-keys/${encodeURIComponent(user)}/${name}`, undefined, org);
    expect((await del(hopper, "ext|grace", "k")).status).toBe(403);
    expect((await del(hopper, "ext|grace", "k")).body.message).toBe("Incorrect user ID provided");
    expect((await del(grace, "ext|hopper", "h")).status).toBe(204);
    expect((await del(grace, "ext|hopper", "h")).status).toBe(404);
    expect((await del(hopper, "ext|hopper", "nope")).status).toBe(404);
    expect(await names(grace)).toEqual(["ext|grace/k"]);
    // An API key may not use the JWT-only route.
    const created = await api(t.url, grace, "POST", "/api-keys", { name: "k2", permissions: [] }, org);
    expect((await api(t.url, created.body.value, "DELETE", "/api-keys/ext%7Cgrace/k", undefined, org)).status).toBe(401);
  });

  it("refuses a deleted user's tokens without provisioning them again; new subjects still are; created again, only later tokens pass", async () => {
    const count = async (sql: string) => (await db.query(sql)).rows[0].n as number;
    const users = () => count(`select count(*)::int as n from "user" where id = 'ext|ida'`);
    const orgs = () => count(`select count(*)::int as n from organization where created_by = 'ext|ida'`);
    const token = await idp.sign("a", { sub: "ext|ida", email: "ida@example.test", name: "Ida" });
    expect((await api(t.url, token, "GET", "/users/me")).status).toBe(200); // provisioned on first use
    expect([await users(), await orgs()]).toEqual([1, 1]);

    expect((await api(t.url, t.adminKey, "DELETE", `/admin/users/${encodeURIComponent("ext|ida")}`)).status).toBe(204);
    expect([await users(), await orgs()]).toEqual([0, 0]);
    // The unexpired token, and one the issuer signs now, are refused and re-create nothing.
    expect((await api(t.url, token, "GET", "/users/me")).status).toBe(401);
    expect((await api(t.url, await idp.sign("a", { sub: "ext|ida" }), "GET", "/organizations")).status).toBe(401);
    expect([await users(), await orgs()]).toEqual([0, 0]);
    expect((await api(t.url, t.adminKey, "GET", "/users")).body.map((u: { id: string }) => u.id)).not.toContain("ext|ida");

    // Just-in-time provisioning of a subject never seen before is unchanged.
    expect((await api(t.url, await idp.sign("a", { sub: "ext|june", name: "June" }), "GET", "/users/me")).body).toMatchObject({ id: "ext|june", name: "June" });

    // The operator creates the user again: tokens from before the deletion stay dead, later ones work.
    expect((await api(t.url, t.adminKey, "POST", "/admin/users", { id: "ext|ida", name: "Ida" })).status).toBe(201);
    expect((await api(t.url, token, "GET", "/users/me")).status).toBe(401);
    const later = await idp.sign("a", { sub: "ext|ida" }, { iat: Math.floor(Date.now() / 1000) + 60 });
    expect((await api(t.url, later, "GET", "/users/me")).body).toMatchObject({ id: "ext|ida" });
    expect((await api(t.url, token, "GET", "/users/me")).status).toBe(401); // also once the user is cached
  });

  it("answers 401 to forged, expired and foreign tokens", async () => {
    const org = { "x-sandbar-organization-id": "00000000-0000-0000-0000-000000000000" };
    const good = await idp.sign("a");
    const [, payload, signature] = good.split(".");
    for (const token of [
      await idp.sign("a", {}, { exp: Math.floor(Date.now() / 1000) - 120 }),
      await idp.sign("a", {}, { audience: "https://other.example" }),
      await idp.sign("a", {}, { issuer: "https://evil.example" }),
      [b64({ alg: "none", typ: "JWT" }), payload, ""].join("."),
      [b64({ alg: "RS256", kid: "a" }), b64({ sub: "sandbar-admin", iss: idp.url, aud: AUDIENCE, exp: 9e9 }), signature].join("."),
      // Validly signed, but an external issuer may not speak for the local bootstrap admin.
      await idp.sign("a", { sub: "sandbar-admin" }),
    ]) {
      expect((await api(t.url, token, "GET", "/api-keys", undefined, org)).status).toBe(401);
    }
  });
});
