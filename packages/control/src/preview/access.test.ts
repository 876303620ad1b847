import { createHash } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { createRequire } from "node:module";
import { beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { eventually, type SandboxFixture } from "../sandboxes/testing/fixtures.ts";
import { proxyV1, proxyV2 } from "../server/testing/proxy-headers.ts";
import { APP_PORT, both, DOMAIN, hostOf, pathOf, previewSuite, root, sandbox, send, startApp, until } from "./testing/suite.ts";

// Who gets through the preview proxy: preview tokens, cookies, API keys and scopes, signed
// preview URLs, public sandboxes, token rotation (the server and app in testing/suite.ts).

const suite = previewSuite();
let f: SandboxFixture;
let port: number;
beforeAll(() => void ({ f, port } = suite.get()));

describe.skipIf(!root)("the preview proxy's access rules", () => {
  let priv: { id: string; token: string };
  beforeAll(async () => {
    priv = await sandbox();
  }, 120_000);

  it("hands out a URL of the host form under the preview domain, with the sandbox's token", async () => {
    const r = await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/preview-url`);
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ sandboxId: priv.id, url: `http://${APP_PORT}-${priv.id}.${DOMAIN}:${port}`, token: priv.token });
    expect(priv.token).toMatch(/^[a-z0-9]{32}$/);
  });

  it("forwards the client address a load balancer's PROXY header states as X-Forwarded-For (both forms)", async () => {
    const headers = { "x-sandbar-preview-token": priv.token };
    const byHost = await send("/info", { host: hostOf(priv.id), headers, proxyHeader: proxyV2("198.51.100.77", 4000) });
    const byPath = await send(pathOf(priv.id), { headers, proxyHeader: proxyV1("2001:db8::77", 4001) });
    expect(byHost.status, byHost.text).toBe(200);
    expect(byPath.status, byPath.text).toBe(200);
    expect(byHost.json.headers["x-forwarded-for"]).toBe("198.51.100.77");
    expect(byPath.json.headers["x-forwarded-for"]).toBe("2001:db8::77");
  });

  it("keeps a private sandbox closed without a credential, in both forms, saying what to send", async () => {
    for (const r of await both(priv.id, "/info")) {
      expect(r.status).toBe(401);
      expect(r.json.message).toMatch(/is private: send its preview token/);
    }
  });

  it("lets the preview token through (both headers, both forms) and strips what the app must not see", async () => {
    for (const header of ["x-sandbar-preview-token", "x-daytona-preview-token"]) {
      const [byHost, byPath] = await both(priv.id, "/info?a=1", { headers: { [header]: priv.token, connection: "keep-alive, x-hop", "x-hop": "1", cookie: `sandbar-preview-${priv.id}=junk; theirs=2` } });
      for (const r of [byHost, byPath]) {
        expect(r.status, r.text).toBe(200);
        const seen = r.json.headers;
        expect(seen[header]).toBeUndefined();
        expect(seen["x-hop"]).toBeUndefined(); // listed in Connection: hop-by-hop
        expect(seen.host).toBe(`127.0.0.1:${APP_PORT}`);
        expect(seen["x-forwarded-for"]).toBe("127.0.0.1");
        expect(seen["x-forwarded-proto"]).toBe("http");
      }
      // The proxy's own cookie never reaches the app; on the path form, no cookie but the
      // preview's own does (below), and its cookies are scoped to it.
      expect(byHost.json.headers.cookie).toBe("theirs=2");
      expect(byHost.headers["set-cookie"]).toEqual(["app=1; Path=/"]);
      expect(byHost.headers["content-security-policy"]).toBeUndefined();
      expect(byPath.json.headers.cookie).toBeUndefined();
      expect(byPath.headers["set-cookie"]).toEqual([expect.stringMatching(new RegExp(`^sbx-[0-9a-f]{16}-app=1; Path=/api/preview-proxy/${priv.id}/${APP_PORT}/$`))]);
      expect(byHost.json.path).toBe("/info?a=1");
      expect(byHost.json.headers["x-forwarded-host"]).toBe(hostOf(priv.id));
      expect(byPath.json.path).toBe("/info?a=1");
      expect(byPath.json.headers["x-forwarded-prefix"]).toBe(`/api/preview-proxy/${priv.id}/${APP_PORT}`);
    }
  });

  it("refuses a wrong token, another sandbox's token and a forged cookie with 401 and the reason", async () => {
    const other = await f.create({});
    const otherToken = (await f.call("GET", `/sandbox/${other.id}/ports/${APP_PORT}/preview-url`)).body.token;
    for (const token of ["forged-token", otherToken]) {
      for (const r of await both(priv.id, "/info", { headers: { "x-sandbar-preview-token": token } })) {
        expect(r.status).toBe(401);
        expect(r.json.message).toMatch(/not this sandbox's current preview token/);
      }
    }
    const forged = `sandbar-preview-${priv.id}=${Math.floor(Date.now() / 1000) + 3600}.${"A".repeat(43)}`;
    for (const r of await both(priv.id, "/info", { headers: { cookie: forged } })) {
      expect(r.status).toBe(401);
      expect(r.json.message).toMatch(/preview cookie is not valid/);
    }
    await f.call("DELETE", `/sandbox/${other.id}`);
  });

  it("lets a member's API key through and answers another organization's key with 404", async () => {
    for (const r of await both(priv.id, "/info", { headers: { authorization: `Bearer ${f.t.adminKey}` } })) {
      expect(r.status, r.text).toBe(200);
      expect(r.json.headers.authorization).toBeUndefined(); // the API key stays with the proxy
    }
    const other = await f.otherOrganization();
    for (const r of await both(priv.id, "/info", { headers: { authorization: `Bearer ${other.key}` } })) expect(r.status).toBe(404);
    for (const r of await both(priv.id, "/info", { headers: { authorization: "Bearer sbr_not-a-key" } })) expect(r.status).toBe(401);
  });

  it("path form: the app's cookies are scoped to the preview (no Domain, Path under its prefix), its pages sandboxed by CSP", async () => {
    const headers = { "x-sandbar-preview-token": priv.token };
    const setCookie = encodeURIComponent("x=1; Path=/; Domain=127.0.0.1; HttpOnly");
    const r = await send(pathOf(priv.id, APP_PORT, `/set-cookie?c=${setCookie}`), { headers });
    expect(r.status, r.text).toBe(200);
    const prefix = `/api/preview-proxy/${priv.id}/${APP_PORT}`;
    const x = (r.headers["set-cookie"] as string[]).find((c) => /^sbx-[0-9a-f]{16}-x=/.test(c))!;
    expect(x).toMatch(new RegExp(`^sbx-[0-9a-f]{16}-x=1; HttpOnly; Path=${prefix}/$`));
    expect(x).not.toMatch(/domain/i);
    expect(r.headers["content-security-policy"]).toBe("sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads");
    // The app's cookie comes back to it under its own name, and nothing else does.
    const pair = x.split(";")[0]!;
    const back = await send(pathOf(priv.id), { headers: { ...headers, cookie: `${pair}; x=untagged; session=of-the-api; sandbar-preview-${priv.id}=1.x` } });
    expect(back.json.headers.cookie).toBe("x=1");
    // A cookie the browser scoped to another preview's path is not this preview's: its server never sees it.
    const other = await f.create({});
    const otherUrl = await f.call("GET", `/sandbox/${other.id}/ports/${APP_PORT}/preview-url`);
    await startApp(other.id);
    const theirs = await send(pathOf(other.id, APP_PORT, `/set-cookie?c=${encodeURIComponent("secret=b; Path=/")}`), { headers: { "x-sandbar-preview-token": otherUrl.body.token } });
    const theirPair = (theirs.headers["set-cookie"] as string[]).find((c) => /-secret=/.test(c))!.split(";")[0]!;
    expect(theirs.headers["set-cookie"]).toContainEqual(expect.stringContaining(`Path=/api/preview-proxy/${other.id}/${APP_PORT}/`));
    const crossed = await send(pathOf(priv.id), { headers: { ...headers, cookie: `${theirPair}; ${pair}` } });
    expect(crossed.json.headers.cookie).toBe("x=1");
    await f.call("DELETE", `/sandbox/${other.id}`);
    // A WebSocket's answer is rewritten the same way.
    const ws = new WebSocket(`ws://127.0.0.1:${port}${pathOf(priv.id, APP_PORT, "/ws?set-cookie")}`, { headers });
    const upgraded = new Promise<IncomingMessage>((ok, fail) => (ws.once("upgrade", ok), ws.once("error", fail)));
    const opened = new Promise((ok) => ws.once("open", ok));
    const upgrade = await upgraded;
    expect(upgrade.headers["set-cookie"]).toEqual([expect.stringMatching(new RegExp(`^sbx-[0-9a-f]{16}-ws=1; Path=${prefix}/$`))]);
    expect(upgrade.headers["content-security-policy"]).toContain("sandbox allow-scripts");
    await opened;
    const echoed = new Promise((ok) => ws.once("message", (m) => ok(m.toString())));
    ws.send("after the head");
    expect(await echoed).toBe("after the head");
    ws.close();
    // The host form is its own origin: its answers are left as the app wrote them.
    const byHost = await send(`/set-cookie?c=${setCookie}`, { host: hostOf(priv.id), headers });
    expect(byHost.headers["set-cookie"]).toEqual(["app=1; Path=/", "x=1; Path=/; Domain=127.0.0.1; HttpOnly"]);
    expect(byHost.headers["content-security-policy"]).toBeUndefined();
  }, 60_000);

  it("reaching a sandbox needs write:sandboxes: preview URLs, the proxy's Bearer check; the preview token opens no toolbox REST route", async () => {
    const volumesOnly = (await f.call("POST", "/api-keys", { name: `volumes-${Date.now()}`, permissions: ["read:volumes"] })).body.value as string;
    expect(volumesOnly).toBeTruthy();
    // It can read the sandbox (membership), but not get its token or a signed URL.
    expect((await f.call("GET", `/sandbox/${priv.id}`, undefined, volumesOnly)).status).toBe(200);
    for (const path of [`/sandbox/${priv.id}/ports/2280/preview-url`, `/sandbox/${priv.id}/ports/${APP_PORT}/preview-url`, `/workspace/${priv.id}/ports/${APP_PORT}/preview-url`, `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url`]) {
      const r = await f.call("GET", path, undefined, volumesOnly);
      expect(r.status, path).toBe(403);
      expect(JSON.stringify(r.body)).not.toContain(priv.token);
    }
    expect((await f.call("POST", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url/unknowntoken0000/expire`, undefined, volumesOnly)).status).toBe(403);
    // As Bearer through the proxy (both forms, and a WebSocket), and on the proxy's check route.
    for (const r of await both(priv.id, "/info", { headers: { authorization: `Bearer ${volumesOnly}` } })) {
      expect(r.status, r.text).toBe(403);
      expect(r.json.message).toMatch(/needs the write:sandboxes scope/);
    }
    const ws = new WebSocket(`ws://127.0.0.1:${port}${pathOf(priv.id, APP_PORT, "/ws")}`, { headers: { authorization: `Bearer ${volumesOnly}` } });
    expect(await new Promise<number>((ok) => ws.once("unexpected-response", (_req, res) => ok(res.statusCode!)))).toBe(403);
    expect((await f.call("GET", `/preview/${priv.id}/access`, undefined, volumesOnly)).status).toBe(403);
    // A scoped key still passes.
    const sandboxes = (await f.call("POST", "/api-keys", { name: `sandboxes-${Date.now()}`, permissions: ["write:sandboxes"] })).body.value as string;
    for (const r of await both(priv.id, "/info", { headers: { authorization: `Bearer ${sandboxes}` } })) expect(r.status, r.text).toBe(200);
    expect((await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/preview-url`, undefined, sandboxes)).body.token).toBe(priv.token);
    // Not while the organization is suspended (as the toolbox, which the same scope gates); the grace period outlasts the test.
    expect((await f.call("POST", `/organizations/${f.orgId}/suspend`, { reason: "unpaid", suspensionCleanupGracePeriodHours: 100_000 })).status).toBe(204);
    try {
      await eventually("the proxy to refuse the suspended organization", async () => {
        const answers = await both(priv.id, "/info", { headers: { authorization: `Bearer ${sandboxes}` } });
        return answers.every((r) => r.status === 403 && r.json.message === "Organization is suspended: unpaid");
      });
    } finally {
      expect((await f.call("POST", `/organizations/${f.orgId}/unsuspend`)).status).toBe(204);
    }
    await eventually("the proxy to let the organization in again", async () => (await both(priv.id, "/info", { headers: { authorization: `Bearer ${sandboxes}` } })).every((r) => r.status === 200));

    // The preview token (got with a full key) is no credential for the toolbox's REST routes, in any spelling.
    const files = `${f.t.url}/api/toolbox/${priv.id}/toolbox/files?path=/tmp`;
    for (const [url, headers] of [
      [files, { authorization: `Bearer ${priv.token}` }],
      [files, { "x-daytona-preview-token": priv.token }],
      [files, { "x-sandbar-preview-token": priv.token }],
      [`${files}&DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`, {}],
    ] as Array<[string, Record<string, string>]>) {
      expect((await fetch(url, { headers })).status, JSON.stringify(headers)).toBe(401);
    }
    // The PTY WebSocket: the token lifts no key that lacks the scope, and is no Bearer credential.
    const pty = `ws://127.0.0.1:${port}/api/toolbox/${priv.id}/toolbox/process/pty/create-connect?id=scope-${Date.now()}`;
    const refusal = (headers: Record<string, string>) =>
      new Promise<number>((ok, fail) => {
        const s = new WebSocket(pty, { headers });
        s.once("unexpected-response", (_req, res) => ok(res.statusCode!));
        s.once("open", () => (s.close(), fail(new Error("the PTY opened"))));
      });
    expect(await refusal({ authorization: `Bearer ${volumesOnly}`, "x-daytona-preview-token": priv.token })).toBe(403);
    expect(await refusal({ authorization: `Bearer ${volumesOnly}` })).toBe(403);
    expect(await refusal({ authorization: `Bearer ${priv.token}` })).toBe(401);
    expect(await refusal({ "x-daytona-preview-token": "not-the-token" })).toBe(401);
  });

  it("turns a token link into an HttpOnly cookie scoped to the host or path, and drops the parameter", async () => {
    const link = await send(`/info?x=1&DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`, { host: hostOf(priv.id) });
    expect(link.status).toBe(200);
    expect(link.json.path).toBe("/info?x=1");
    const cookie = (link.headers["set-cookie"] as string[]).find((c) => c.startsWith(`sandbar-preview-${priv.id}=`))!;
    expect(cookie).toMatch(/; Path=\/; Max-Age=3600; HttpOnly; SameSite=Lax$/);
    const pair = cookie.split(";")[0]!;
    const again = await send("/other", { host: hostOf(priv.id), headers: { cookie: pair } });
    expect(again.status).toBe(200);
    expect(again.json.headers.cookie).toBeUndefined();

    const byPath = await send(pathOf(priv.id, APP_PORT, `/info?DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`));
    expect(byPath.status).toBe(200);
    expect(byPath.json.path).toBe("/info");
    const pathCookie = (byPath.headers["set-cookie"] as string[]).find((c) => c.startsWith("sandbar-preview-"))!;
    expect(pathCookie).toContain(`; Path=/api/preview-proxy/${priv.id}/;`);
  });
  it("serves the PreviewService checks: public, validate, access", async () => {
    expect((await f.call("GET", `/preview/${priv.id}/public`, undefined, "")).status).toBe(404);
    const valid = await f.call("GET", `/preview/${priv.id}/validate/${priv.token}`, undefined, "");
    expect(valid.status).toBe(200);
    expect(valid.body).toBe(true);
    expect((await f.call("GET", `/preview/${priv.id}/validate/nottheone`, undefined, "")).status).toBe(404);
    const access = await f.call("GET", `/preview/${priv.id}/access`);
    expect(access.status).toBe(200);
    expect(access.body).toBe(true);
    expect((await f.call("GET", `/preview/${priv.id}/access`, undefined, "")).status).toBe(401);
    const other = await f.otherOrganization();
    expect((await f.call("GET", `/preview/${priv.id}/access`, undefined, other.key)).status).toBe(404);
  });

  it("signed preview URLs open one port until they expire or are expired; bounds are checked", async () => {
    const r = await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url?expiresInSeconds=2`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.token).toMatch(/^[a-z0-9]{16}$/);
    expect(r.body.url).toBe(`http://${APP_PORT}-${r.body.token}.${DOMAIN}:${port}`);
    const token = r.body.token as string;
    const byHost = await send("/info", { host: `${APP_PORT}-${token}.${DOMAIN}:${port}` });
    expect(byHost.status, byHost.text).toBe(200);
    expect((await send(pathOf(token, APP_PORT, "/info"))).status).toBe(200);
    // Another port of the same sandbox is not opened by it.
    const otherPort = await send(pathOf(token, 9999, "/"));
    expect(otherPort.status).toBe(403);
    expect(otherPort.json.message).toBe("Invalid or expired token");
    // Two seconds on, it has expired.
    await until("the signed URL to expire", async () => (await send(pathOf(token, APP_PORT, "/info"))).status, 403);

    const second = (await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url?expiresInSeconds=600`)).body.token;
    expect((await send(pathOf(second, APP_PORT, "/info"))).status).toBe(200);
    // Stored as a hash only.
    const rows = (await f.t.server.orm.em.getConnection().execute(`select token_hash from signed_preview_url`)) as Array<{ token_hash: string }>;
    expect(rows.some((row) => row.token_hash === createHash("sha256").update(second).digest("hex"))).toBe(true);
    expect(JSON.stringify(rows)).not.toContain(second);
    expect((await f.call("POST", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url/${second}/expire`)).status).toBe(201);
    await until("the expiry to reach the proxy", async () => (await send(pathOf(second, APP_PORT, "/info"))).status, 403);
    expect((await f.call("POST", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url/unknowntoken0000/expire`)).status).toBe(201);

    for (const bad of ["0", "86401", "-5"]) {
      const res = await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url?expiresInSeconds=${bad}`);
      expect(res.status).toBe(400);
      expect(res.body.message).toBe("expiresInSeconds must be between 1 second and 24 hours");
    }
    expect((await f.call("GET", `/sandbox/${priv.id}/ports/0/signed-preview-url`)).body.message).toBe("Invalid port");
    expect((await f.call("GET", `/sandbox/${priv.id}/ports/70000/preview-url`)).body.message).toBe("Invalid port");
    const other = await f.otherOrganization();
    expect((await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url`, undefined, other.key)).status).toBe(404);
  }, 30_000);

  it("works from the official client (0.218): preview link, signed preview URL made, used and expired", async () => {
    const sdk = createRequire(import.meta.url)("sdk-0218") as typeof import("sdk-0218");
    const daytona = new sdk.Daytona({ apiKey: f.t.adminKey, apiUrl: `${f.t.url}/api`, target: "local", useDeprecatedPolling: true });
    const sandbox = await daytona.get(priv.id);
    const link = await sandbox.getPreviewLink(APP_PORT);
    expect(link.url).toBe(`http://${hostOf(priv.id)}`);
    const viaLink = await send("/info", { host: new URL(link.url).host, headers: { "x-daytona-preview-token": link.token } });
    expect(viaLink.status).toBe(200);
    const signed = await sandbox.getSignedPreviewUrl(APP_PORT, 120);
    expect(signed).toMatchObject({ sandboxId: priv.id, port: APP_PORT });
    expect((await send("/info", { host: new URL(signed.url).host })).status).toBe(200);
    await sandbox.expireSignedPreviewUrl(APP_PORT, signed.token);
    await until("the expiry to reach the proxy", async () => (await send("/info", { host: new URL(signed.url).host })).status, 403);
  });

  it("opens a public sandbox's ports to anyone, except the toolbox port 2280; private again closes them", async () => {
    expect((await f.call("POST", `/sandbox/${priv.id}/public/true`)).status).toBe(201);
    await until("the sandbox to be public at the proxy", async () => (await both(priv.id, "/info")).map((r) => r.status), 200);
    expect((await f.call("GET", `/preview/${priv.id}/public`, undefined, "")).body).toBe(true);
    const toolbox = await send("/", { host: hostOf(priv.id, 2280) });
    expect(toolbox.status).toBe(401);
    expect((await f.call("POST", `/sandbox/${priv.id}/public/false`)).status).toBe(201);
    await until("the sandbox to be private again at the proxy", async () => (await both(priv.id, "/info")).map((r) => r.status), 401);
  });

  it("rotates the token on restart: the old token and its cookie stop working; a stopped sandbox answers 503", async () => {
    const link = await send(`/info?DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`, { host: hostOf(priv.id) });
    const cookie = (link.headers["set-cookie"] as string[]).find((c) => c.startsWith("sandbar-preview-"))!.split(";")[0]!;
    expect((await f.call("POST", `/sandbox/${priv.id}/stop`)).status).toBe(200);
    // Until the proxy's cache has the new state, the app is merely unreachable (also a 503).
    let stopped = await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } });
    await eventually("the stop to reach the proxy", async () => {
      stopped = await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } });
      return /\(state: stopped\)/.test(stopped.text);
    });
    expect(stopped.status).toBe(503);
    expect(stopped.json.message).toMatch(/is not running \(state: stopped\)/);
    // A stopped private sandbox still tells nothing to a caller without a credential.
    expect((await send("/info", { host: hostOf(priv.id) })).status).toBe(401);

    expect((await f.call("POST", `/sandbox/${priv.id}/start`)).status).toBe(200);
    await startApp(priv.id);
    const fresh = (await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/preview-url`)).body.token;
    expect(fresh).not.toBe(priv.token);
    await until("the old token to be refused", async () => (await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } })).status, 401);
    const oldCookie = await send("/info", { host: hostOf(priv.id), headers: { cookie } });
    expect(oldCookie.status).toBe(401);
    expect(oldCookie.json.message).toMatch(/preview cookie is not valid/);
    expect((await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": fresh } })).status).toBe(200);
    priv.token = fresh;
  }, 120_000);
});
