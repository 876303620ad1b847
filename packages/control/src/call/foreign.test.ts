import { afterEach, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

// The S3 endpoint and the internal registry's token service check credentials of their own
// protocols (SigV4 push keys, basic auth), through the chain's foreign admission: a bad attempt
// counts against the client address's failed authentications like a bad API key, and a blocked
// address is refused by every way in. Each case gets its own server (the block lasts the window).

const FAILED_AUTH = 3;
const rateLimits = { store: "memory" as const, windowSeconds: 600, limits: { anonymous: 0, authenticated: 0, "sandbox-create": 0, "sandbox-lifecycle": 0, "failed-auth": FAILED_AUTH } };

let t: TestServer | undefined;
afterEach(async () => {
  await t?.stop();
  t = undefined;
});

describe("ways in with credentials of their own", () => {
  it("the S3 endpoint: unsigned requests count as failed authentications, and the blocked address is refused by the API too", async () => {
    t = await startTestServer({ settings: { rateLimits } });
    const unsigned = () => fetch(`${t!.url}/s3/sandbar-builds/any/key`);
    for (let i = 1; i < FAILED_AUTH; i++) {
      const r = await unsigned();
      expect(r.status).toBe(403);
      expect(await r.text()).toContain("<Code>AccessDenied</Code>");
    }
    // The limit-th failure blocks the address: S3 clients are told to slow down.
    const blocked = await unsigned();
    expect(blocked.status).toBe(503);
    expect(await blocked.text()).toContain("<Code>SlowDown</Code>");
    expect((await api(t.url, t.adminKey, "GET", "/api-keys/current")).status).toBe(429);
  });

  it("the registry's token service: wrong secrets count as failed authentications, and the blocked address is refused by the API too", async () => {
    t = await startTestServer({ settings: { rateLimits, internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } } });
    const access = await api(t.url, t.adminKey, "GET", "/docker-registry/registry-push-access");
    expect(access.status).toBe(200);
    const challenge = (await fetch(`http://${access.body.registryUrl}/v2/`)).headers.get("www-authenticate") ?? "";
    const realm = /realm="([^"]+)"/.exec(challenge)?.[1];
    const service = /service="([^"]+)"/.exec(challenge)?.[1];
    expect(realm).toBeDefined();
    const token = (secret: string) => fetch(`${realm}?service=${service}`, { headers: { authorization: `Basic ${Buffer.from(`${access.body.username}:${secret}`).toString("base64")}` } });
    expect((await token(access.body.secret)).status).toBe(200);
    for (let i = 1; i < FAILED_AUTH; i++) expect((await token("wrong")).status).toBe(401);
    const blocked = await token("wrong");
    expect(blocked.status).toBe(429);
    expect(await blocked.json()).toMatchObject({ errors: [{ code: "TOOMANYREQUESTS" }] });
    // Good credentials from the blocked address are refused before they are read, here and on the API.
    expect((await token(access.body.secret)).status).toBe(429);
    expect((await api(t.url, t.adminKey, "GET", "/api-keys/current")).status).toBe(429);
  });
});
