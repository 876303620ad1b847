import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { request } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import v8 from "node:v8";
import { runInNewContext } from "node:vm";
import { chromium } from "playwright-core";
import { beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { eventually, type SandboxFixture } from "../sandboxes/testing/fixtures.ts";
import { APP_PORT, DOMAIN, hostOf, pathOf, previewSuite, root, sandbox, send } from "./testing/suite.ts";
import type { UntypedJson } from "../casts.ts";

// What the preview proxy carries: large and streamed bodies, HTTP/1.0 apps, WebSockets, bad ports,
// smuggling attempts, activity, a real browser (the server and app in testing/suite.ts).

const suite = previewSuite();
let f: SandboxFixture;
let port: number;
beforeAll(() => void ({ f, port } = suite.get()));

describe.skipIf(!root)("the preview proxy's traffic", () => {
  let priv: { id: string; token: string };
  beforeAll(async () => {
    priv = await sandbox();
  }, 120_000);

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
      const chunked = await new Promise<UntypedJson>((resolve, reject) => {
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
        // The server answers each of these with a 400 and closes the connection: read to its end.
        s.write(text);
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
    // Stamps are throttled (up to 10 s apart): proxied requests go on until one is recorded.
    const before = await stamp();
    await eventually("a proxied request to stamp activity", async () => {
      const r = await send("/info", { host: hostOf(priv.id), headers: { "x-sandbar-preview-token": priv.token } });
      expect(r.status).toBe(200);
      return (await stamp()) > before;
    }, 50_000);
  }, 60_000);
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
});
