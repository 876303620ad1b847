import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createRequire } from "node:module";
import { request, type IncomingMessage } from "node:http";
import { connect } from "node:net";
import { rm } from "node:fs/promises";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import v8 from "node:v8";
import { runInNewContext } from "node:vm";
import { chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "../sandboxes/testing/fixtures.ts";
import { APP_PY } from "./testing/app.ts";
import { proxyV1, proxyV2 } from "../server/testing/proxy-headers.ts";

// The preview proxy end to end: real sandboxes running the real agent (bundled from source, with
// its tunnel), a python web app and WebSocket echo inside, reached through the control port by
// host (`{port}-{id}.preview.localhost`) and by path (`/api/preview-proxy/{id}/{port}/...`), with
// real PostgreSQL behind. Nothing is mocked. Run as root.

const root = process.getuid?.() === 0;
const APP_PORT = 8000;
const DOMAIN = "preview.localhost";
const BALANCER = "127.0.0.9";

let bundle: string;
let f: SandboxFixture;
let port: number;

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: any;
}

/** An HTTP/1.1 request to the control port with any Host header (node's client, no DNS). */
function send(path: string, opts: { host?: string; method?: string; headers?: Record<string, string>; body?: Buffer | string; proxyHeader?: Buffer } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    // With `proxyHeader`: over a connection from the balancer's address that starts with it.
    const through = opts.proxyHeader;
    const viaBalancer = () => {
      const socket = connect({ host: "127.0.0.1", port, localAddress: BALANCER });
      socket.write(through!);
      return socket;
    };
    const connection = through ? { createConnection: viaBalancer } : { agent: false };
    const req = request({ host: "127.0.0.1", port, path, method: opts.method ?? "GET", headers: { ...(opts.host ? { host: opts.host } : {}), ...opts.headers }, ...connection }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString();
        let json: any;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode!, headers: res.headers, text, json });
      });
    });
    req.on("error", reject);
    req.end(opts.body);
  });
}

const hostOf = (id: string, p = APP_PORT) => `${p}-${id}.${DOMAIN}:${port}`;
const pathOf = (id: string, p = APP_PORT, rest = "/info") => `/api/preview-proxy/${id}/${p}${rest}`;

/** Both forms of one request to the app. */
async function both(id: string, rest: string, opts: { headers?: Record<string, string>; method?: string } = {}): Promise<[Answer, Answer]> {
  return [await send(rest, { ...opts, host: hostOf(id) }), await send(pathOf(id, APP_PORT, rest), opts)];
}

async function startApp(id: string, appPort = APP_PORT): Promise<void> {
  await f.exec(id, `cat > /tmp/app.py <<'PYEOF'\n${APP_PY}\nPYEOF`);
  const session = `app-${appPort}-${Date.now()}`;
  expect((await f.call("POST", `/toolbox/${id}/toolbox/process/session`, { sessionId: session })).status).toBe(201);
  const run = await f.call("POST", `/toolbox/${id}/toolbox/process/session/${session}/exec`, { command: `python3 /tmp/app.py ${appPort}`, runAsync: true });
  expect(run.status, JSON.stringify(run.body)).toBe(202);
  await eventually("the app to listen", async () => (await f.exec(id, `python3 -c "import socket; socket.create_connection(('127.0.0.1', ${appPort}))" 2>/dev/null && echo up`)).result.includes("up"));
}

async function sandbox(body: Record<string, unknown> = {}): Promise<{ id: string; token: string }> {
  const s = await f.create(body);
  await startApp(s.id);
  const url = await f.call("GET", `/sandbox/${s.id}/ports/${APP_PORT}/preview-url`);
  return { id: s.id, token: url.body.token };
}

/** Waits out the proxy's one-second read cache. */
const settle = () => new Promise((r) => setTimeout(r, 1100));

beforeAll(async () => {
  if (!root) return;
  bundle = await buildAgentBundle();
  // 127.0.0.9 plays a TCP load balancer sending PROXY headers; every other loopback address is a plain client.
  f = await sandboxFixture({ agentBundle: bundle, previewDomain: DOMAIN, proxyProtocolFrom: [BALANCER] });
  port = f.t.server.port;
}, 600_000);

afterAll(async () => {
  await f?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

describe.skipIf(!root)("the preview proxy", () => {
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

  it("streams a 100 MB response with flat memory in the control process: a slow reader holds the sandbox back", async () => {
    // The reader is curl, another process, reading at 25 MB/s while the app writes as fast as it
    // can: without back-pressure the control process would hold most of the 100 MB. Measured as
    // the buffers alive after a full GC (what the process holds, not garbage awaiting collection),
    // sampled through the transfer; RSS is reported beside it.
    v8.setFlagsFromString("--expose-gc");
    // Buffers a GC found dead are freed at once rather than by a background sweeper, so the
    // figure right after gc() is what is alive.
    v8.setFlagsFromString("--no-concurrent-array-buffer-sweeping");
    const gc = runInNewContext("gc") as () => void;
    gc();
    const before = process.memoryUsage();
    let peakBuffers = before.arrayBuffers;
    let peakRss = before.rss;
    const timer = setInterval(() => {
      gc();
      const m = process.memoryUsage();
      peakBuffers = Math.max(peakBuffers, m.arrayBuffers);
      peakRss = Math.max(peakRss, m.rss);
    }, 250);
    const started = performance.now();
    const out = await new Promise<string>((resolve, reject) => {
      const curl = spawn("curl", ["-sS", "--limit-rate", "25M", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "-H", `Host: ${hostOf(priv.id)}`, "-H", `X-Sandbar-Preview-Token: ${priv.token}`, `http://127.0.0.1:${port}/big?mb=100`]);
      let text = "";
      curl.stdout.on("data", (c: Buffer) => (text += c.toString()));
      curl.on("error", reject);
      curl.on("exit", () => resolve(text));
    });
    clearInterval(timer);
    const seconds = (performance.now() - started) / 1000;
    const mb = (n: number) => (n / (1 << 20)).toFixed(1);
    console.log(`100 MiB to a 25 MB/s reader in ${seconds.toFixed(2)} s: live buffers grew ${mb(peakBuffers - before.arrayBuffers)} MiB at most, RSS ${mb(peakRss - before.rss)} MiB`);
    expect(out).toBe(`200 ${100 << 20}`);
    expect(seconds).toBeGreaterThan(3); // the reader really was slow
    // Held, the app's 100 MB would show here (it writes them within a second or two).
    expect((peakBuffers - before.arrayBuffers) / (1 << 20)).toBeLessThan(4);
  }, 120_000);

  it("streams 100 MB at full speed, intact", async () => {
    const hash = createHash("sha256");
    let size = 0;
    const started = performance.now();
    await new Promise<void>((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port, path: "/big?mb=100", headers: { host: hostOf(priv.id), "x-sandbar-preview-token": priv.token } }, (res) => {
        expect(res.statusCode).toBe(200);
        res.on("data", (c: Buffer) => {
          size += c.length;
          hash.update(c);
        });
        res.on("end", resolve);
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end();
    });
    const seconds = (performance.now() - started) / 1000;
    console.log(`100 MiB through the proxy in ${seconds.toFixed(2)} s (${(100 / seconds).toFixed(0)} MiB/s)`);
    expect(size).toBe(100 << 20);
    expect(hash.digest("hex")).toBe(createHash("sha256").update(Buffer.alloc(100 << 20, "x")).digest("hex"));
  }, 120_000);

  it("streams a request body through (Content-Length and chunked), intact", async () => {
    const body = Buffer.alloc(20 << 20);
    for (let i = 0; i < body.length; i += 4096) body[i] = i % 251;
    const sha = createHash("sha256").update(body).digest("hex");
    const r = await send(pathOf(priv.id, APP_PORT, "/sum"), { method: "POST", headers: { "x-sandbar-preview-token": priv.token, "content-length": String(body.length) }, body });
    expect(r.status, r.text).toBe(200);
    expect(r.json).toEqual({ length: body.length, sha256: sha, path: "/sum", te: null });
    // Chunked, written piece by piece: forwarded chunked.
    for (const method of ["POST", "PUT"]) {
      const chunked = await new Promise<any>((resolve, reject) => {
        const req = request({ host: "127.0.0.1", port, method, path: "/sum", headers: { host: hostOf(priv.id), "x-sandbar-preview-token": priv.token, "transfer-encoding": "chunked" } }, (res) => {
          let text = "";
          res.on("data", (c) => (text += c));
          res.on("end", () => resolve(JSON.parse(text)));
        });
        req.on("error", reject);
        for (let i = 0; i < body.length; i += 1 << 20) req.write(body.subarray(i, i + (1 << 20)));
        req.end();
      });
      expect(chunked).toEqual({ length: body.length, sha256: sha, path: "/sum", te: "chunked" });
    }
  }, 60_000);

  it("serves a stock `python3 -m http.server` (HTTP/1.0: one answer per connection), again and again", async () => {
    await f.call("POST", `/toolbox/${priv.id}/toolbox/process/session`, { sessionId: "stock" });
    await f.call("POST", `/toolbox/${priv.id}/toolbox/process/session/stock/exec`, { command: "cd /tmp && exec python3 -m http.server 8001 --bind 127.0.0.1", runAsync: true });
    await eventually("http.server to listen", async () => (await send(pathOf(priv.id, 8001, "/"), { headers: { "x-sandbar-preview-token": priv.token } })).status === 200);
    for (let i = 0; i < 5; i++) {
      const r = await send(pathOf(priv.id, 8001, "/"), { headers: { "x-sandbar-preview-token": priv.token } });
      expect(r.status).toBe(200);
      expect(r.text).toContain("app.py");
      const file = await send("/app.py", { host: hostOf(priv.id, 8001), headers: { "x-sandbar-preview-token": priv.token } });
      expect(file.status).toBe(200);
      expect(file.text).toContain("ThreadingHTTPServer");
    }
  });

  it("carries WebSockets in both forms with a token, and refuses them without", async () => {
    for (const url of [`ws://127.0.0.1:${port}/ws`, `ws://127.0.0.1:${port}${pathOf(priv.id, APP_PORT, "/ws")}`]) {
      const headers = url.includes("preview-proxy") ? {} : { host: hostOf(priv.id) };
      const ws = new WebSocket(url, { headers: { ...headers, "x-daytona-preview-token": priv.token } });
      await new Promise((ok, fail) => (ws.once("open", ok), ws.once("error", fail)));
      const got: string[] = [];
      ws.on("message", (m) => got.push(m.toString()));
      ws.send("hello");
      ws.send(Buffer.alloc(70_000, "b"));
      await eventually("the echoes", async () => got.length === 2);
      expect(got[0]).toBe("hello");
      expect(got[1]!.length).toBe(70_000);
      ws.close();

      const refused = new WebSocket(url, { headers });
      const status = await new Promise<number>((ok) => refused.once("unexpected-response", (_req, res) => ok(res.statusCode!)));
      expect(status).toBe(401);
    }
  });

  it("answers 502 with a message for a port nobody listens on, and 400 Invalid port for bad ports", async () => {
    for (const r of [await send("/", { host: hostOf(priv.id, 9999), headers: { "x-sandbar-preview-token": priv.token } }), await send(pathOf(priv.id, 9999, "/"), { headers: { "x-sandbar-preview-token": priv.token } })]) {
      expect(r.status).toBe(502);
      expect(r.json.message).toBe(`Nothing listens on port 9999 in sandbox ${priv.id}`);
    }
    for (const bad of ["0", "65536", "99999", "-1", "80x", "1e3"]) {
      const r = await send(`/api/preview-proxy/${priv.id}/${bad}/info`, { headers: { "x-sandbar-preview-token": priv.token } });
      expect(r.status, bad).toBe(400);
      expect(r.json.message).toBe("Invalid port");
    }
    expect((await send("/", { host: `0-${priv.id}.${DOMAIN}` })).status).toBe(400);
    expect((await send("/", { host: `70000-${priv.id}.${DOMAIN}` })).status).toBe(400);
    // Not a sandbox id (nor a signed token): 404, as for a sandbox that does not exist.
    expect((await send("/api/preview-proxy/not-a-sandbox/8000/")).status).toBe(404);
    expect((await send("/api/preview-proxy/00000000-0000-4000-8000-000000000000/8000/")).status).toBe(404);
  });

  it("refuses smuggling and header injection before anything reaches the sandbox", async () => {
    const raw = (text: string) =>
      new Promise<string>((resolve) => {
        const s = connect(port, "127.0.0.1");
        let out = "";
        s.on("data", (c) => (out += c.toString()));
        s.on("end", () => resolve(out));
        s.on("error", () => resolve(out));
        s.write(text);
        setTimeout(() => s.end(), 1500);
      });
    const host = hostOf(priv.id);
    const token = `X-Sandbar-Preview-Token: ${priv.token}\r\n`;
    // Content-Length and Transfer-Encoding together: the classic CL.TE desync.
    const clte = await raw(`POST /sum HTTP/1.1\r\nHost: ${host}\r\n${token}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(clte).toMatch(/^HTTP\/1\.1 400/);
    expect(clte).not.toContain("/smuggled");
    // An obfuscated Transfer-Encoding, a bare LF in a header value, a header without a colon.
    for (const bad of [
      `POST /sum HTTP/1.1\r\nHost: ${host}\r\n${token}Transfer-Encoding: xchunked\r\n\r\n`,
      `GET /info HTTP/1.1\r\nHost: ${host}\r\n${token}X-Evil: a\rInjected: b\r\n\r\n`,
      `GET /info HTTP/1.1\r\nHost: ${host}\r\n${token}Broken header\r\n\r\n`,
    ]) {
      expect(await raw(bad)).toMatch(/^HTTP\/1\.1 400/);
    }
    // An absolute-form target may not pick another host or port.
    const absolute = await raw(`GET http://127.0.0.1:22/ HTTP/1.1\r\nHost: ${host}\r\n${token}Connection: close\r\n\r\n`);
    expect(absolute).toMatch(/^HTTP\/1\.1 400/);
    expect(absolute).toContain("origin form");
    // A path-form request cannot climb out of its port: the target stays port 8000's server.
    const climb = await send(`/api/preview-proxy/${priv.id}/${APP_PORT}/../9999/info`, { headers: { "x-sandbar-preview-token": priv.token } });
    expect([200, 404]).toContain(climb.status);
    if (climb.status === 200) expect(climb.json.headers.host).toBe(`127.0.0.1:${APP_PORT}`);
  });

  it("counts proxied traffic as activity", async () => {
    const stamp = async () => new Date((await f.call("GET", `/sandbox/${priv.id}`)).body.lastActivityAt ?? (await f.call("GET", `/sandbox/${priv.id}`)).body.updatedAt).getTime();
    await new Promise((r) => setTimeout(r, 11_000)); // past the activity throttle (10 s at most)
    const before = await stamp();
    const r = await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } });
    expect(r.status).toBe(200);
    await eventually("the activity stamp", async () => (await stamp()) > before, 5000);
  }, 30_000);

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
    await new Promise((res) => setTimeout(res, 2100));
    expect((await send(pathOf(token, APP_PORT, "/info"))).status).toBe(403);

    const second = (await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url?expiresInSeconds=600`)).body.token;
    expect((await send(pathOf(second, APP_PORT, "/info"))).status).toBe(200);
    // Stored as a hash only.
    const rows = (await f.t.server.orm.em.getConnection().execute(`select token_hash from signed_preview_url`)) as Array<{ token_hash: string }>;
    expect(rows.some((row) => row.token_hash === createHash("sha256").update(second).digest("hex"))).toBe(true);
    expect(JSON.stringify(rows)).not.toContain(second);
    expect((await f.call("POST", `/sandbox/${priv.id}/ports/${APP_PORT}/signed-preview-url/${second}/expire`)).status).toBe(201);
    await settle();
    expect((await send(pathOf(second, APP_PORT, "/info"))).status).toBe(403);
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
    await settle();
    expect((await send("/info", { host: new URL(signed.url).host })).status).toBe(403);
  });

  it("opens a public sandbox's ports to anyone, except the toolbox port 2280; private again closes them", async () => {
    expect((await f.call("POST", `/sandbox/${priv.id}/public/true`)).status).toBe(201);
    await settle();
    for (const r of await both(priv.id, "/info")) expect(r.status).toBe(200);
    expect((await f.call("GET", `/preview/${priv.id}/public`, undefined, "")).body).toBe(true);
    const toolbox = await send("/", { host: hostOf(priv.id, 2280) });
    expect(toolbox.status).toBe(401);
    expect((await f.call("POST", `/sandbox/${priv.id}/public/false`)).status).toBe(201);
    await settle();
    for (const r of await both(priv.id, "/info")) expect(r.status).toBe(401);
  });

  it("reaches the app from a real browser: a token link, then (host form) the page's own fetch and WebSocket on the cookie, or (path form) a sandboxed page", async () => {
    const profile = await mkdtemp(join(tmpdir(), "sandbar-chromium-"));
    const browser = await chromium.launchPersistentContext(profile, {
      executablePath: "/usr/bin/chromium",
      headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", `--host-resolver-rules=MAP *.${DOMAIN} 127.0.0.1`],
    });
    try {
      const base = `http://${hostOf(priv.id)}/page`;
      const page = await browser.newPage();
      await page.goto(`${base}?DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`);
      await page.waitForFunction("document.getElementById('out').textContent !== 'loading'", undefined, { timeout: 15_000 });
      expect(await page.textContent("#out")).toBe("path=/info?from=page echo=ping from the page");
      expect((await browser.cookies(base)).find((c) => c.name === `sandbar-preview-${priv.id}`)).toMatchObject({ httpOnly: true, sameSite: "Lax" });
      await page.close();

      // The path form shares the API's origin, so its page runs sandboxed in an opaque origin: its
      // script runs but cannot read cookies, and its requests are cross-origin (this app's own
      // fetch fails: it sends no CORS headers). The cookie the link left still opens the next
      // top-level navigation, and the app's cookie is kept to the preview's path.
      const api = `http://127.0.0.1:${port}`;
      const sandboxed = await browser.newPage();
      const first = await sandboxed.goto(`${api}${pathOf(priv.id, APP_PORT, "/page")}?DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`);
      expect(first?.status()).toBe(200);
      await sandboxed.waitForFunction("document.getElementById('out').textContent !== 'loading'", undefined, { timeout: 15_000 });
      expect(await sandboxed.textContent("#out")).toMatch(/^failed: /);
      expect(await sandboxed.evaluate("self.origin")).toBe("null");
      expect(await sandboxed.evaluate("(() => { try { return document.cookie; } catch (e) { return e.name; } })()")).toBe("SecurityError");
      const again = await sandboxed.goto(`${api}${pathOf(priv.id, APP_PORT, "/other")}`);
      expect(again?.status()).toBe(200);
      expect(JSON.parse(await sandboxed.innerText("body")).path).toBe("/other");
      const appCookie = (await browser.cookies(`${api}${pathOf(priv.id, APP_PORT, "/")}`)).find((c) => c.name.endsWith("-app"))!;
      expect(appCookie).toMatchObject({ path: `/api/preview-proxy/${priv.id}/${APP_PORT}/`, domain: "127.0.0.1" });
      expect((await browser.cookies(`${api}/api/sandbox`)).map((c) => c.name)).toEqual([]);
      await sandboxed.close();
      // Without the token the browser gets the 401 page, not the app.
      await browser.clearCookies();
      const bare = await browser.newPage();
      const res = await bare.goto(`http://${hostOf(priv.id)}/page`);
      expect(res?.status()).toBe(401);
    } finally {
      await browser.close();
      await rm(profile, { recursive: true, force: true });
    }
  }, 60_000);

  it("rotates the token on restart: the old token and its cookie stop working; a stopped sandbox answers 503", async () => {
    const link = await send(`/info?DAYTONA_SANDBOX_AUTH_KEY=${priv.token}`, { host: hostOf(priv.id) });
    const cookie = (link.headers["set-cookie"] as string[]).find((c) => c.startsWith("sandbar-preview-"))!.split(";")[0]!;
    expect((await f.call("POST", `/sandbox/${priv.id}/stop`)).status).toBe(200);
    await settle();
    const stopped = await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } });
    expect(stopped.status).toBe(503);
    expect(stopped.json.message).toMatch(/is not running \(state: stopped\)/);
    // A stopped private sandbox still tells nothing to a caller without a credential.
    expect((await send("/info", { host: hostOf(priv.id) })).status).toBe(401);

    expect((await f.call("POST", `/sandbox/${priv.id}/start`)).status).toBe(200);
    await startApp(priv.id);
    const fresh = (await f.call("GET", `/sandbox/${priv.id}/ports/${APP_PORT}/preview-url`)).body.token;
    expect(fresh).not.toBe(priv.token);
    await settle();
    expect((await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } })).status).toBe(401);
    const oldCookie = await send("/info", { host: hostOf(priv.id), headers: { cookie } });
    expect(oldCookie.status).toBe(401);
    expect(oldCookie.json.message).toMatch(/preview cookie is not valid/);
    expect((await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": fresh } })).status).toBe(200);
    priv.token = fresh;
  }, 120_000);
});
