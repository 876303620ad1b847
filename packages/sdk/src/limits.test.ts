import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { issuerSettings, TestIssuer } from "../../control/src/testing/issuer.ts";
import { startTestServer, type TestServer } from "../../control/src/testing/server.ts";
import { DEFAULT_LIMITS } from "../../control/src/limits/settings.ts";
import { ConfigurationError, RateLimitedError, Sandbar, UnauthenticatedError, type RetryInfo, type SandbarClientOptions } from "./index.ts";

// Rate limits, retries and credentials against a real server whose general ("authenticated")
// counter allows 3 calls per 2-second window per organization, and which trusts a test OpenID
// issuer for JWTs (the issuer is a stand-in for a person's sign-in: it only signs tokens).

const LIMIT = 3;
const WINDOW_S = 2;
let t: TestServer;
let scratch: string;
const idp = new TestIssuer();

const clientWith = (o: SandbarClientOptions) => new Sandbar({ apiUrl: `${t.url}/api`, env: {}, envFileDir: false, configDir: path.join(scratch, "none"), ...o });

/** Calls until the admin's organization is refused: its counter is then blocked for a window from now. */
async function exhaust(): Promise<void> {
  const once = clientWith({ apiKey: t.adminKey, retry: { maxAttempts: 1 } });
  try {
    for (let i = 0; i <= LIMIT; i++) {
      const refused = await once.sandboxes.list().then(
        () => false,
        (e: unknown) => {
          if (e instanceof RateLimitedError) return true;
          throw e;
        },
      );
      if (refused) return;
    }
    throw new Error(`${LIMIT + 1} calls in a row were not refused`);
  } finally {
    once.close();
  }
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-sdk-limits-"));
  await idp.start();
  await idp.addKey("k1");
  t = await startTestServer({
    settings: { ...issuerSettings(idp), rateLimits: { store: "memory", windowSeconds: WINDOW_S, limits: { ...DEFAULT_LIMITS, authenticated: LIMIT } } },
  });
}, 120_000);
afterAll(async () => {
  await t?.stop();
  idp.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe("rate limits", () => {
  it("a call past the limit fails with RateLimitedError carrying retryAfter from the response", async () => {
    const once = clientWith({ apiKey: t.adminKey, retry: { maxAttempts: 1 } });
    await exhaust();
    const err = await once.sandboxes.list().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RateLimitedError);
    const limited = err as RateLimitedError;
    expect(limited).toMatchObject({ code: "resource_exhausted", status: 429 });
    expect(limited.retryAfter).toBeGreaterThanOrEqual(1);
    expect(limited.retryAfter).toBeLessThanOrEqual(2 * WINDOW_S);
    expect(limited.metadata.get("x-ratelimit-limit")).toBe(String(LIMIT));
    once.close();
  });

  it("an idempotent call is retried after Retry-After and succeeds once the window is over", async () => {
    const retries: RetryInfo[] = [];
    const client = clientWith({ apiKey: t.adminKey, retry: { onRetry: (i) => retries.push(i) } });
    await exhaust();
    const t0 = Date.now();
    const page = await client.sandboxes.list();
    const waited = Date.now() - t0;
    expect(page.items).toBeInstanceOf(Array);
    expect(retries.length).toBeGreaterThanOrEqual(1);
    expect(retries[0]).toMatchObject({ method: "sandbar.control.v1.SandboxService/ListSandboxes", attempt: 1, code: Code.ResourceExhausted });
    // The wait was the server's Retry-After (whole seconds), not a short backoff.
    expect(retries[0].delayMs).toBeGreaterThanOrEqual(1000);
    expect(waited).toBeGreaterThanOrEqual(retries[0].delayMs - 50);
    client.close();
  }, 30_000);

  it("a state-changing call is not retried: its 429 comes back at once", async () => {
    const retries: RetryInfo[] = [];
    const client = clientWith({ apiKey: t.adminKey, retry: { onRetry: (i) => retries.push(i) } });
    await exhaust();
    // No retry announced: the client waits only between attempts, so it did not wait.
    await expect(client.volumes.create("never")).rejects.toBeInstanceOf(RateLimitedError);
    expect(retries).toEqual([]);
    client.close();
  }, 30_000);

  it("a Retry-After beyond maxRetryAfterMs fails at once instead of waiting", async () => {
    const retries: RetryInfo[] = [];
    const client = clientWith({ apiKey: t.adminKey, retry: { maxRetryAfterMs: 100, onRetry: (i) => retries.push(i) } });
    await exhaust();
    await expect(client.sandboxes.list()).rejects.toBeInstanceOf(RateLimitedError);
    // No retry announced: the client waits only between attempts, so it did not wait.
    expect(retries).toEqual([]);
    client.close();
  }, 30_000);
});

describe("credentials", () => {
  it("a JWT lists the person's organizations, and acts in the one named by organizationId", async () => {
    const jwtToken = await idp.sign("k1", { sub: "ext|sdk-person", email: "person@example.test" });
    const person = clientWith({ jwtToken });
    const orgs = await person.organizations.list();
    expect(orgs.length).toBe(1);
    const org = orgs[0];
    // Organizations of their own (JWT only), listed with the personal one, then deleted. The person's
    // own counter (3 per window) opened with the first list: create is its 2nd call; a list past
    // the limit waits for the next window (reads are retried).
    const region = (await person.services.regions.listSharedRegions({})).items[0];
    const team = await person.organizations.create({ name: "sdk-team", defaultRegionId: region.id });
    expect((await person.organizations.list()).map((o) => o.name).sort()).toEqual([org.name, "sdk-team"].sort());
    await person.organizations.delete(team.id);
    expect((await person.organizations.list()).map((o) => o.id)).toEqual([org.id]);
    person.close();
    const inOrg = clientWith({ jwtToken, organizationId: org.id });
    const vol = await inOrg.volumes.create("persons-volume");
    expect(vol.organizationId).toBe(org.id);
    expect((await inOrg.volumes.list()).map((v) => v.name)).toEqual(["persons-volume"]);
    // Not the admin's organization: its key does not see the volume.
    const admin = clientWith({ apiKey: t.adminKey, retry: { maxAttempts: 10 } });
    expect((await admin.volumes.list()).map((v) => v.name)).not.toContain("persons-volume");
    admin.close();
    inOrg.close();
  }, 30_000);

  it("a wrong key is UnauthenticatedError; no credentials at all is a ConfigurationError before any call, except on public methods", async () => {
    const wrong = clientWith({ apiKey: "sbr_wrong" });
    await expect(wrong.apiKeys.current()).rejects.toBeInstanceOf(UnauthenticatedError);
    wrong.close();
    const none = clientWith({});
    await expect(none.sandboxes.list()).rejects.toThrow(ConfigurationError);
    await expect(none.sandboxes.list()).rejects.toThrow(/SANDBAR_API_KEY/);
    expect((await none.services.config.getConfig({})).oidc?.clientId).toBe("sandbar-test");
    none.close();
  });
});
