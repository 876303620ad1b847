import { rm } from "node:fs/promises";
import { request } from "node:http";
import { connect } from "node:net";
import { afterAll, beforeAll, expect } from "vitest";
import { buildAgentBundle } from "../../testing/agent-bundle.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "../../sandboxes/testing/fixtures.ts";
import { APP_PY } from "./app.ts";
import type { UntypedJson } from "../../casts.ts";

// The preview proxy end to end: real sandboxes running the real agent (bundled from source, with
// its tunnel), a python web app and WebSocket echo inside, reached through the control port by
// host (`{port}-{id}.preview.localhost`) and by path (`/api/preview-proxy/{id}/{port}/...`), with
// real PostgreSQL behind. Nothing is mocked. Run as root. One server per test file: the file calls
// previewSuite(), then the helpers below.

export const root = process.getuid?.() === 0;
export const APP_PORT = 8000;
export const DOMAIN = "preview.localhost";
const BALANCER = "127.0.0.9";

let bundle: string | undefined;
let f: SandboxFixture;
let port: number;

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: UntypedJson;
}

/** Starts the file's server (as root) before its tests and stops it after; answers the fixture and the control port. */
export function previewSuite(): { get(): { f: SandboxFixture; port: number } } {
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
  return { get: () => ({ f, port }) };
}

/** An HTTP/1.1 request to the control port with any Host header (node's client, no DNS). */
export function send(path: string, opts: { host?: string; method?: string; headers?: Record<string, string>; body?: Buffer | string; proxyHeader?: Buffer } = {}): Promise<Answer> {
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
        let json: UntypedJson;
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

export const hostOf = (id: string, p = APP_PORT) => `${p}-${id}.${DOMAIN}:${port}`;
export const pathOf = (id: string, p = APP_PORT, rest = "/info") => `/api/preview-proxy/${id}/${p}${rest}`;

/** Both forms of one request to the app. */
export async function both(id: string, rest: string, opts: { headers?: Record<string, string>; method?: string } = {}): Promise<[Answer, Answer]> {
  return [await send(rest, { ...opts, host: hostOf(id) }), await send(pathOf(id, APP_PORT, rest), opts)];
}

export async function startApp(id: string, appPort = APP_PORT): Promise<void> {
  await f.exec(id, `cat > /tmp/app.py <<'PYEOF'\n${APP_PY}\nPYEOF`);
  const session = `app-${appPort}-${Date.now()}`;
  expect((await f.call("POST", `/toolbox/${id}/toolbox/process/session`, { sessionId: session })).status).toBe(201);
  const run = await f.call("POST", `/toolbox/${id}/toolbox/process/session/${session}/exec`, { command: `python3 /tmp/app.py ${appPort}`, runAsync: true });
  expect(run.status, JSON.stringify(run.body)).toBe(202);
  await eventually("the app to listen", async () => (await f.exec(id, `python3 -c "import socket; socket.create_connection(('127.0.0.1', ${appPort}))" 2>/dev/null && echo up`)).result.includes("up"));
}

export async function sandbox(body: Record<string, unknown> = {}): Promise<{ id: string; token: string }> {
  const s = await f.create(body);
  await startApp(s.id);
  const url = await f.call("GET", `/sandbox/${s.id}/ports/${APP_PORT}/preview-url`);
  return { id: s.id, token: url.body.token };
}

/** Waits out the proxy's one-second read cache. */

/** Polls until `status` answers `want` (the proxy reads a sandbox's state through a one-second cache). */
export async function until(what: string, status: () => Promise<number | number[]>, want: number): Promise<void> {
  await eventually(what, async () => [await status()].flat().every((s) => s === want));
}
