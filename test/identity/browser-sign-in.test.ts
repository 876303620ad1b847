import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { decodeProtectedHeader } from "jose";
import pg from "pg";
import { chromium, type BrowserContext } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { removeRetiredKeys } from "../../packages/control/src/identity/keys.ts";
import { setUserPassword } from "../../packages/control/src/identity/user-passwords.ts";
import { discover, loopback, pkce, tokenRequest, type Discovery } from "./oidc-client.ts";

const PASSWORD = "correct horse battery staple 42";
const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];

describe("sign-in through the built-in issuer, in a real browser", () => {
  let t: TestServer;
  let browser: BrowserContext;
  let profile: string;
  let oidc: Discovery;
  let orgId: string;
  let db: pg.Client;

  beforeAll(async () => {
    t = await startTestServer({ settings: { bootstrapPassword: PASSWORD } });
    profile = await mkdtemp(join(tmpdir(), "sandbar-chromium-"));
    browser = await chromium.launchPersistentContext(profile, { executablePath: "/usr/bin/chromium", headless: true, args: CHROMIUM_ARGS });
    const config = (await api(t.url, undefined, "GET", "/config")).body;
    oidc = await discover(config.oidc.issuer);
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    orgId = (await db.query(`select organization_id from organization_member where user_id = 'sandbar-admin'`)).rows[0].organization_id;
  });

  afterAll(async () => {
    await db?.end();
    await browser?.close();
    await t?.stop();
    if (profile) await rm(profile, { recursive: true, force: true });
  });

  it("/config advertises the built-in issuer, client and audience", async () => {
    const { body } = await api(t.url, undefined, "GET", "/config");
    expect(body.oidc).toEqual({ issuer: `${t.url}/oidc`, clientId: "sandbar-cli", audience: `${t.url}/api` });
    expect(oidc.issuer).toBe(`${t.url}/oidc`);
  });

  /** The whole CLI flow: authorize with PKCE, log in on the page, code to the loopback, token exchange. */
  async function signIn(login = "sandbar-admin", password = PASSWORD) {
    const { verifier, challenge } = pkce();
    const cb = await loopback();
    const state = "st-" + Math.random().toString(36).slice(2);
    const authorize = new URL(oidc.authorization_endpoint);
    for (const [k, v] of Object.entries({
      client_id: "sandbar-cli", response_type: "code", redirect_uri: cb.redirectUri, scope: "openid email profile offline_access",
      code_challenge: challenge, code_challenge_method: "S256", state,
      // The browser keeps the issuer's session: ask for the login page even when signed in.
      prompt: "login",
    })) authorize.searchParams.set(k, v);
    const page = await browser.newPage();
    try {
      page.setDefaultTimeout(10_000);
      await page.goto(authorize.href);
      await page.fill("#login", login);
      await page.fill("#password", "wrong password");
      await Promise.all([page.waitForResponse((r) => r.request().method() === "POST"), page.click("button[type=submit]")]);
      await expect.poll(() => page.textContent(".error")).toContain("Wrong e-mail, user name or password");
      await page.fill("#password", password);
      await Promise.all([page.waitForURL((u) => u.pathname === "/callback", { timeout: 20_000 }), page.click("button[type=submit]")]);
      const query = await cb.received;
      expect(query.get("state")).toBe(state);
      const code = query.get("code");
      expect(code).toBeTruthy();
      // Without the verifier the code is refused (PKCE), and then the real exchange succeeds.
      const noVerifier = await tokenRequest(oidc.token_endpoint, { grant_type: "authorization_code", code: code!, redirect_uri: cb.redirectUri, client_id: "sandbar-cli" });
      expect(noVerifier.status).toBe(400);
      return { code: code!, redirectUri: cb.redirectUri, verifier };
    } finally {
      await page.close();
      cb.server.close();
    }
  }

  let tokens: Record<string, string>;
  let liveToken = "";

  it("signs in, exchanges the code and calls the API with the JWT and the organization header", async () => {
    const { code, redirectUri, verifier } = await signIn();
    const exchange = await tokenRequest(oidc.token_endpoint, { grant_type: "authorization_code", code, redirect_uri: redirectUri, client_id: "sandbar-cli", code_verifier: verifier });
    expect(exchange.status).toBe(200);
    tokens = exchange.body;
    expect(tokens.access_token.split(".")).toHaveLength(3);
    expect(tokens.refresh_token).toBeTruthy();

    const org = { "x-sandbar-organization-id": orgId };
    const created = await api(t.url, tokens.access_token, "POST", "/api-keys", { name: "from-browser", permissions: ["write:sandboxes"] }, org);
    expect(created.status).toBe(201);
    const listed = await api(t.url, tokens.access_token, "GET", "/api-keys", undefined, { "x-daytona-organization-id": orgId });
    expect(listed.status).toBe(200);
    expect(listed.body.map((k: { name: string }) => k.name).sort()).toEqual(["from-browser", "sandbar-admin"]);
    // The organization header is required with a JWT; a JWT on an API-key-only route is 401.
    expect((await api(t.url, tokens.access_token, "GET", "/api-keys")).status).toBe(403);
    expect((await api(t.url, tokens.access_token, "GET", "/api-keys/current", undefined, org)).status).toBe(401);
    // An ID token is not an access token for the API (its audience is the client): 401.
    expect((await api(t.url, tokens.id_token, "GET", "/api-keys", undefined, org)).status).toBe(401);
    // A tampered token is 401.
    const [h, p, s] = tokens.access_token.split(".");
    const forged = [h, Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(p!, "base64url").toString()), sub: "someone" })).toString("base64url"), s].join(".");
    expect((await api(t.url, forged, "GET", "/api-keys", undefined, org)).status).toBe(401);
    // The key's owner deletes it by user id.
    expect((await api(t.url, tokens.access_token, "DELETE", "/api-keys/sandbar-admin/from-browser", undefined, org)).status).toBe(204);
    expect((await api(t.url, tokens.access_token, "DELETE", "/api-keys/sandbar-admin/from-browser", undefined, org)).status).toBe(404);
  });

  it("a refresh token gives a new access token; signing keys rotate without breaking live tokens", async () => {
    const org = { "x-sandbar-organization-id": orgId };
    const oldToken = tokens.access_token;
    const oldKid = decodeProtectedHeader(oldToken).kid;

    await t.server.identity.issuer!.rotateKeys();
    const refreshed = await tokenRequest(oidc.token_endpoint, { grant_type: "refresh_token", refresh_token: tokens.refresh_token, client_id: "sandbar-cli" });
    expect(refreshed.status).toBe(200);
    // Stored hashed: the table holds the refresh token, but not its value.
    const rows = (await db.query(`select id || ' ' || payload::text as p from oidc_payload where kind = 'RefreshToken'`)).rows.map((r) => r.p as string);
    expect(rows.length).toBeGreaterThan(0);
    for (const secret of [refreshed.body.refresh_token, tokens.refresh_token]) expect(rows.join("\n")).not.toContain(secret);
    const newToken = refreshed.body.access_token;
    expect(decodeProtectedHeader(newToken).kid).not.toBe(oldKid);
    // Refresh tokens rotate: the used one is spent.
    expect(refreshed.body.refresh_token).not.toBe(tokens.refresh_token);
    expect((await tokenRequest(oidc.token_endpoint, { grant_type: "refresh_token", refresh_token: tokens.refresh_token, client_id: "sandbar-cli" })).status).toBe(400);
    // Replaying a spent refresh token revokes the grant: the new one is dead too.
    expect((await tokenRequest(oidc.token_endpoint, { grant_type: "refresh_token", refresh_token: refreshed.body.refresh_token, client_id: "sandbar-cli" })).status).toBe(400);

    // Both keys are published; both tokens verify.
    const jwks = (await (await fetch(oidc.jwks_uri)).json()) as { keys: Array<{ kid: string; d?: string }> };
    expect(jwks.keys.map((k) => k.kid)).toContain(oldKid);
    expect(jwks.keys.every((k) => k.d === undefined)).toBe(true);
    expect((await api(t.url, newToken, "GET", "/api-keys", undefined, org)).status).toBe(200);
    expect((await api(t.url, oldToken, "GET", "/api-keys", undefined, org)).status).toBe(200);

    // Once the retired key is removed, its tokens stop verifying; the new key's still work.
    const pool = new pg.Pool({ connectionString: t.server.databaseUrl });
    await removeRetiredKeys(pool);
    await pool.end();
    await t.server.identity.issuer!.reloadKeys();
    expect((await api(t.url, oldToken, "GET", "/api-keys", undefined, org)).status).toBe(401);
    expect((await api(t.url, newToken, "GET", "/api-keys", undefined, org)).status).toBe(200);
    liveToken = newToken;
  });

  it("a second control process on the same database serves the same issuer", async () => {
    const b = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey, settings: { publicUrl: t.url } });
    try {
      const org = { "x-sandbar-organization-id": orgId };
      expect((await api(b.url, liveToken, "GET", "/api-keys", undefined, org)).status).toBe(200);
      expect((await api(b.url, undefined, "GET", "/config")).body.oidc.issuer).toBe(`${t.url}/oidc`);
      // Same published keys at both.
      const kids = async (base: string) => ((await (await fetch(`${base}/oidc/jwks`)).json()) as { keys: Array<{ kid: string }> }).keys.map((k) => k.kid).sort();
      expect(await kids(b.url)).toEqual(await kids(t.url));
    } finally {
      await b.stop();
    }
  });

  it("another user signs in by e-mail and gets their own identity, without access to others' organizations", async () => {
    await db.query(`insert into "user" (id, name, email) values ('lin', 'Lin', 'Lin@Example.test')`);
    const pool = new pg.Pool({ connectionString: t.server.databaseUrl });
    await setUserPassword(pool, "lin", "lin's long password");
    await pool.end();
    const { code, redirectUri, verifier } = await signIn("lin@example.test", "lin's long password");
    const exchange = await tokenRequest(oidc.token_endpoint, { grant_type: "authorization_code", code, redirect_uri: redirectUri, client_id: "sandbar-cli", code_verifier: verifier });
    expect(exchange.status).toBe(200);
    // The code is single-use.
    expect((await tokenRequest(oidc.token_endpoint, { grant_type: "authorization_code", code, redirect_uri: redirectUri, client_id: "sandbar-cli", code_verifier: verifier })).status).toBe(400);
    expect(JSON.parse(Buffer.from(exchange.body.access_token.split(".")[1]!, "base64url").toString()).sub).toBe("lin");
    expect((await api(t.url, exchange.body.access_token, "GET", "/api-keys", undefined, { "x-sandbar-organization-id": orgId })).status).toBe(403);
  });

  it("answers bad sign-in requests with 4xx pages, not errors", async () => {
    expect((await fetch(`${t.url}/oidc/interaction/unknown`)).status).toBe(400);
    const post = await fetch(`${t.url}/oidc/interaction/unknown/login`, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "login=a&password=b" });
    expect(post.status).toBe(400);
    const badRedirect = await fetch(`${t.url}/oidc/auth?client_id=sandbar-cli&response_type=code&redirect_uri=https://evil.example/cb&scope=openid&code_challenge=abc&code_challenge_method=S256`);
    expect(badRedirect.status).toBe(400);
    const noPkce = await fetch(`${t.url}/oidc/auth?client_id=sandbar-cli&response_type=code&redirect_uri=http://127.0.0.1:9/callback&scope=openid`, { redirect: "manual" });
    expect(new URL(noPkce.headers.get("location")!).searchParams.get("error")).toBe("invalid_request");
  });

  it("stores no password, key or token in clear", async () => {
    const pw = (await db.query(`select password_hash from user_password where user_id = 'sandbar-admin'`)).rows[0].password_hash as string;
    expect(pw).toMatch(/^scrypt\$/);
    expect(pw).not.toContain(PASSWORD);
    const dump = (await db.query(`select kind || ' ' || id || ' ' || payload::text as p from oidc_payload`)).rows.map((r) => r.p as string).join("\n");
    expect(dump).toContain("Session");
    expect(dump).not.toContain(PASSWORD);
  });
});
