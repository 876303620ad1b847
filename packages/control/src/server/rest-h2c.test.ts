import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import http2 from "node:http2";
import { join } from "node:path";
import { promisify } from "node:util";
import { filesIn } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RouteTable } from "../gateway/route-table.ts";
import { TOOLBOX_PREFIXES } from "../toolbox/mount.ts";
import { PREFIXES, SANDBOX, startFixture, type Fixture } from "../toolbox/rest/test-fixture.ts";
import type { UntypedJson } from "../casts.ts";

// REST on the one port over HTTP/2 cleartext, as curl (prior knowledge, and HTTP/1.1 with
// `Upgrade: h2c`, served over HTTP/1.1) and node:http2 send it: the contract's routes, the
// hand-written toolbox routes (multipart upload, streamed download, followed log) and the answer
// to a WebSocket asked for over HTTP/2. Every REST route once answered 500 over h2c.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture();
});
afterAll(async () => f?.stop());

const run = promisify(execFile);

/** curl's answer: status, HTTP version it spoke, body. */
async function curl(mode: "--http2-prior-knowledge" | "--http2", path: string, args: string[] = [], key: string | null = f.adminKey) {
  const auth = key ? ["-H", `authorization: Bearer ${key}`] : [];
  const { stdout } = await run("curl", ["-sS", "-N", mode, ...auth, ...args, "-w", "\n%{http_code} %{http_version}", `${f.url}/api${path}`]);
  const cut = stdout.lastIndexOf("\n");
  const [status, version] = stdout.slice(cut + 1).split(" ");
  const text = stdout.slice(0, cut);
  let json: UntypedJson;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: Number(status), version, text, json };
}

const toolbox = `/toolbox/${SANDBOX}/toolbox`;

describe.each([
  ["--http2-prior-knowledge", "2"],
  ["--http2", "1.1"],
] as const)("curl %s", (mode, version) => {
  it("GET /api/config, an authenticated GET, a POST with a JSON body", async () => {
    const config = await curl(mode, "/config", [], null);
    expect({ status: config.status, version: config.version }).toEqual({ status: 200, version });
    expect(config.json.version).toEqual(expect.any(String));
    const current = await curl(mode, "/api-keys/current");
    expect(current).toMatchObject({ status: 200, version, json: { name: "sandbar-admin" } });
    const name = `h2-${mode}`;
    const created = await curl(mode, "/api-keys", ["-H", "content-type: application/json", "--data", JSON.stringify({ name, permissions: [] })]);
    expect(created).toMatchObject({ status: 201, version, json: { name, value: expect.stringMatching(/^sbr_/) } });
  });

  it("errors keep their status and JSON body", async () => {
    expect(await curl(mode, "/no-such-thing")).toMatchObject({ status: 404, version, json: { statusCode: 404, message: "Cannot GET /api/no-such-thing" } });
    expect(await curl(mode, "/api-keys", [], null)).toMatchObject({ status: 401, json: { statusCode: 401, message: "Invalid credentials" } });
    const bad = await curl(mode, "/api-keys", ["-H", "content-type: application/json", "--data", '{"name": ']);
    expect(bad).toMatchObject({ status: 400, json: { message: "Invalid JSON in request body" } });
  });

  it("multipart upload, streamed download and a followed log of the toolbox", async () => {
    const local = join(f.root, `local-${version}.bin`);
    const content = Buffer.from(`bytes over ${mode}\n`.repeat(5000));
    await writeFile(local, content);
    const dest = join(f.root, `up-${version}.bin`);
    const up = await curl(mode, `${toolbox}/files/upload?path=${encodeURIComponent(dest)}`, ["-F", `file=@${local}`]);
    expect(up).toMatchObject({ status: 200, version, json: { path: dest, bytes: content.length } });
    expect((await readFile(dest)).equals(content)).toBe(true);
    const down = await curl(mode, `${toolbox}/files/download?path=${encodeURIComponent(dest)}`);
    expect({ status: down.status, version: down.version, same: down.text === content.toString() }).toEqual({ status: 200, version, same: true });

    const sessionId = `h2-${version}`;
    const json = ["-H", "content-type: application/json", "--data"];
    expect((await curl(mode, `${toolbox}/process/session`, [...json, JSON.stringify({ sessionId })])).status).toBe(201);
    const started = await curl(mode, `${toolbox}/process/session/${sessionId}/exec`, [...json, JSON.stringify({ command: "for i in 1 2 3; do echo line $i; sleep 0.1; done", runAsync: true })]);
    expect(started.status).toBe(202);
    const log = await curl(mode, `${toolbox}/process/session/${sessionId}/command/${started.json.cmdId}/logs?follow=true`);
    expect({ status: log.status, version: log.version, text: log.text }).toEqual({ status: 200, version, text: "line 1\nline 2\nline 3\n" });
  });

  it("a path only a WebSocket serves answers 426 with a message", async () => {
    const res = await curl(mode, `${toolbox}/process/pty/create-connect`);
    expect(res).toMatchObject({ status: 426, version, json: { statusCode: 426, message: expect.stringContaining("is a WebSocket") } });
  });
});

/** One request on an HTTP/2 session: status, headers and the whole body. */
function h2(session: http2.ClientHttp2Session, method: string, path: string, opts: { body?: string | Buffer; headers?: http2.OutgoingHttpHeaders; key?: string | null } = {}) {
  const key = opts.key === undefined ? f.adminKey : opts.key;
  const stream = session.request({ ":method": method, ":path": `/api${path}`, ...(key ? { authorization: `Bearer ${key}` } : {}), ...opts.headers }, { endStream: opts.body === undefined });
  if (opts.body !== undefined) stream.end(opts.body);
  return new Promise<{ status: number; headers: http2.IncomingHttpHeaders; body: Buffer; json: UntypedJson }>((resolve, reject) => {
    let headers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    stream.on("response", (h) => (headers = h));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", reject);
    stream.on("end", () => {
      const body = Buffer.concat(chunks);
      let json: UntypedJson;
      try {
        json = JSON.parse(body.toString());
      } catch {
        json = undefined;
      }
      resolve({ status: Number(headers[":status"]), headers, body, json });
    });
  });
}

describe("node:http2 client", () => {
  let session: http2.ClientHttp2Session;
  beforeAll(() => {
    session = http2.connect(f.url);
  });
  afterAll(() => session?.close());

  it("JSON answers, HEAD, a CORS preflight and a 404, on one session", async () => {
    expect(await h2(session, "GET", "/config", { key: null })).toMatchObject({ status: 200, json: { version: expect.any(String) } });
    const head = await h2(session, "HEAD", "/config", { key: null });
    expect({ status: head.status, length: head.body.length, type: head.headers["content-type"] }).toEqual({ status: 200, length: 0, type: "application/json; charset=utf-8" });
    const preflight = await h2(session, "OPTIONS", "/api-keys", { key: null, headers: { origin: "https://app.example", "access-control-request-headers": "authorization" } });
    expect({ status: preflight.status, origin: preflight.headers["access-control-allow-origin"] }).toEqual({ status: 204, origin: "https://app.example" });
    expect(await h2(session, "GET", "/nope")).toMatchObject({ status: 404, json: { message: "Cannot GET /api/nope" } });
    const created = await h2(session, "POST", "/api-keys", { body: JSON.stringify({ name: "h2-node", permissions: [] }), headers: { "content-type": "application/json" } });
    expect(created).toMatchObject({ status: 201, json: { name: "h2-node" } });
    expect(await h2(session, "DELETE", "/api-keys/h2-node")).toMatchObject({ status: 204 });
  });

  it("a server stream of the contract (newline-delimited JSON) and a bulk download (multipart)", async () => {
    const pty = await h2(session, "POST", `${toolbox}/process/pty`, { body: JSON.stringify({ id: "h2-pty", cols: 80, rows: 24 }), headers: { "content-type": "application/json" } });
    expect(pty.status).toBe(201);
    // The first event of the terminal's stream, then the client goes away.
    const stream = session.request({ ":path": `/api${toolbox}/process/pty/h2-pty/connect`, authorization: `Bearer ${f.adminKey}` });
    const first = await new Promise<string>((resolve, reject) => {
      stream.once("data", (c: Buffer) => resolve(c.toString()));
      stream.once("error", reject);
    });
    expect(JSON.parse(first.split("\n")[0]!)).toEqual({ connected: {} });
    stream.close(http2.constants.NGHTTP2_CANCEL);
    expect((await h2(session, "DELETE", `${toolbox}/process/pty/h2-pty`)).status).toBe(200);

    await writeFile(join(f.root, "h2-a.txt"), "alpha");
    const bulk = await h2(session, "POST", `${toolbox}/files/bulk-download`, { body: JSON.stringify({ paths: [join(f.root, "h2-a.txt")] }), headers: { "content-type": "application/json" } });
    expect(bulk.status).toBe(200);
    expect(bulk.body.toString()).toMatch(/name="file"[\s\S]*\r\n\r\nalpha\r\n--sandbar-[0-9a-f]+--\r\n$/);
  });

  it("every GET route answers as over HTTP/1.1, and no route answers 500 (503: a part this server runs without)", async () => {
    const services = (await filesIn("sandbar/control/v1")).flatMap((file) => file.services);
    const agent = (await filesIn("sandbar/agent/v1")).flatMap((file) => file.services);
    const table = new RouteTable([{ services }, { services: agent, prefix: PREFIXES[0], omitUnset: true }]);
    const fill = (template: string) =>
      template.replace(/\{([a-z0-9_]+)(=[^}]*)?\}/g, (_m, name: string) => (name === "sandbox_id" && template.startsWith(TOOLBOX_PREFIXES[0]!) ? SANDBOX : "nothing-here"));
    const differ: string[] = [];
    for (const route of table.routes) {
      const path = fill(route.template);
      if (route.verb === "GET") {
        const [one, two] = [await fetch(`${f.url}/api${path}`, { headers: { authorization: `Bearer ${f.adminKey}` } }), await h2(session, "GET", path)];
        await one.arrayBuffer();
        if (one.status !== two.status || two.status === 500) differ.push(`GET ${path}: HTTP/1.1 ${one.status}, HTTP/2 ${two.status} ${two.json?.message ?? ""}`);
      } else {
        // Without credentials (nothing changes): the gateway's answer up to the guard.
        const res = await h2(session, route.verb, path, { key: null, body: route.body ? "{}" : undefined, headers: route.body ? { "content-type": "application/json" } : {} });
        if (res.status !== 401) differ.push(`${route.verb} ${path}: HTTP/2 ${res.status} ${res.json?.message ?? ""}`);
      }
    }
    expect(differ).toEqual([]);
  });
});
