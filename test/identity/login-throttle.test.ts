/**
 * The login page's throttle on real servers (built-in issuer, real PostgreSQL), client addresses
 * set through a trusted proxy's X-Forwarded-For: a stranger's wrong passwords throttle the
 * stranger's address, never the login itself; the login's own failures only slow it, and not for
 * the right password from where its user signed in before. Then two control processes on one
 * database with the PostgreSQL store: they count together. The slowdown is shrunk for the test
 * (at most MAX_DELAY_MS) so that nothing waits long; the limits are the defaults.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_LOGIN_THROTTLE } from "../../packages/control/src/identity/login-throttle.ts";
import { setUserPassword } from "../../packages/control/src/identity/user-passwords.ts";
import { loadRateLimitSettings } from "../../packages/control/src/limits/settings.ts";
import { api, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { discover, FormSignIn, type Discovery } from "./oidc-client.ts";

const PASSWORD = "the admin's long password";
const MAX_DELAY_MS = 2000;
const throttleSettings = { bootstrapPassword: PASSWORD, trustedProxies: ["127.0.0.1"], loginThrottle: { baseDelayMs: 100, maxDelayMs: MAX_DELAY_MS } };
const { pairLimit, addressLimit } = DEFAULT_LOGIN_THROTTLE;

/** Signs in with the right password from `from` and checks the code is good for tokens; answers how long the login form took. */
async function signsIn(oidc: Discovery, base: string, login: string, password: string, from: string): Promise<number> {
  const s = await FormSignIn.start(oidc);
  const done = await s.submit(login, password, from);
  expect(done.code, `${done.status} ${done.html.slice(0, 400)}`).toBeTruthy();
  const tokens = await s.exchange(done.code!);
  expect(tokens.status).toBe(200);
  expect((await api(base, tokens.body.access_token, "GET", "/users/me")).status).toBe(200);
  return done.ms;
}

/**
 * Whether `fast` settles while `slow` is still pending. Used with `slow` started first and slowed
 * by the throttle: `fast` wins only if nothing slowed it (no elapsed time is compared).
 */
async function settlesFirst(fast: Promise<unknown>, slow: Promise<unknown>): Promise<boolean> {
  let slowDone = false;
  void slow.then(() => (slowDone = true), () => (slowDone = true));
  await fast;
  return !slowDone;
}

/** A user with a password (the row written directly: the operator's API would make an RSA key pair too, slowly). */
async function userWithPassword(t: TestServer, id: string, password: string): Promise<void> {
  const pool = new pg.Pool({ connectionString: t.server.databaseUrl, max: 1 });
  await pool.query(`insert into "user" (id, name) values ($1, $1)`, [id]);
  await setUserPassword(pool, id, password);
  await pool.end();
}

describe("one control process", () => {
  let t: TestServer;
  let oidc: Discovery;

  beforeAll(async () => {
    t = await startTestServer({ settings: throttleSettings });
    oidc = await discover(`${t.url}/oidc`);
  });
  afterAll(() => t?.stop());

  it("throttles a stranger's address, never the login: the admin still signs in from elsewhere", async () => {
    const A = "198.51.100.66";
    const B = "203.0.113.5";
    const s = await FormSignIn.start(oidc);
    // Wrong passwords for the admin from A: each one checked (401) up to the pair limit...
    for (let i = 0; i < pairLimit; i++) expect((await s.submit("sandbar-admin", `guess ${i}`, A)).status).toBe(401);
    // ...then A may not try the admin login any more, the right password included.
    const refused = await s.submit("sandbar-admin", PASSWORD, A);
    expect(refused.status).toBe(429);
    expect(refused.html).toContain("Too many failed sign-ins from your address");
    // A goes on with other logins up to the address limit: then A is refused whatever it tries.
    let other = 0;
    for (; ; other++) {
      const r = await s.submit(`someone-${other}`, "guess", A);
      if (r.status === 429) break;
      expect(r.status).toBe(401);
    }
    expect(pairLimit + other).toBe(addressLimit);
    expect((await s.submit("nobody", "guess", A)).status).toBe(429);

    // From B, an address that has done nothing wrong, the right password signs in: slowed by the
    // login's failures (B never signed in as the admin before), not refused.
    expect(await signsIn(oidc, t.url, "sandbar-admin", PASSWORD, B)).toBeGreaterThanOrEqual(MAX_DELAY_MS);
    // A stays throttled.
    const still = await (await FormSignIn.start(oidc)).submit("sandbar-admin", PASSWORD, A);
    expect(still.status).toBe(429);
  });

  it("lets the right password from a known-good address through at once, whatever the guesses from many addresses", async () => {
    await userWithPassword(t, "kay", "kay's long password");
    const K = "192.0.2.10";
    // Kay signs in from K once: K is known-good for kay from now on.
    await signsIn(oidc, t.url, "kay", "kay's long password", K);

    // A spree of wrong passwords for kay from many addresses, a few at a time.
    // A spree of wrong passwords for kay from many addresses at once (scrypt runs a few at a time on
    // libuv's threads): each is checked, none of those addresses being throttled.
    const s = await FormSignIn.start(oidc);
    const spree = await Promise.all(Array.from({ length: 16 }, (_, i) => s.submit("kay", "a guess", `198.18.0.${i + 1}`)));
    expect(spree.map((a) => a.status)).toEqual(Array(16).fill(401));

    // From an address kay never used the right password waits out the login's slowdown, then
    // passes; from K, started after it, it is neither refused nor slowed: it is through first.
    const elsewhere = signsIn(oidc, t.url, "kay", "kay's long password", "192.0.2.99");
    expect(await settlesFirst(signsIn(oidc, t.url, "kay", "kay's long password", K), elsewhere)).toBe(true);
    expect(await elsewhere).toBeGreaterThanOrEqual(MAX_DELAY_MS);
    // A wrong password from K is slowed like any other.
    expect((await s.submit("kay", "a guess", K)).ms).toBeGreaterThanOrEqual(MAX_DELAY_MS);
  });
});

describe("two control processes on one database (SANDBAR_RATE_LIMIT_STORE=postgres)", () => {
  let a: TestServer;
  let b: TestServer;
  let oidcA: Discovery;
  let oidcB: Discovery;

  beforeAll(async () => {
    const settings = { ...throttleSettings, rateLimits: { ...loadRateLimitSettings({}), store: "postgres" as const } };
    a = await startTestServer({ settings });
    b = await startTestServer({ databaseUrl: a.server.databaseUrl, adminKey: a.adminKey, settings });
    oidcA = await discover(`${a.url}/oidc`);
    oidcB = await discover(`${b.url}/oidc`);
  });
  afterAll(async () => {
    await b?.stop();
    await a?.stop();
  });

  it("count one address's failures together, and share the known-good addresses", async () => {
    const K = "192.0.2.20";
    await signsIn(oidcA, a.url, "sandbar-admin", PASSWORD, K);

    // Half the pair limit at each process: the next attempt, at either, is refused.
    const A = "198.51.100.77";
    const atA = await FormSignIn.start(oidcA);
    const atB = await FormSignIn.start(oidcB);
    for (let i = 0; i < pairLimit; i++) expect((await (i % 2 ? atB : atA).submit("sandbar-admin", `guess ${i}`, A)).status).toBe(401);
    expect((await atA.submit("sandbar-admin", PASSWORD, A)).status).toBe(429);
    expect((await atB.submit("sandbar-admin", PASSWORD, A)).status).toBe(429);

    // The login's failures slow it at both; K, known-good from the sign-in at a, is not slowed at b.
    const elsewhere = signsIn(oidcB, b.url, "sandbar-admin", PASSWORD, "192.0.2.21");
    expect(await settlesFirst(signsIn(oidcB, b.url, "sandbar-admin", PASSWORD, K), elsewhere)).toBe(true);
    expect(await elsewhere).toBeGreaterThanOrEqual(MAX_DELAY_MS);
  });
});
