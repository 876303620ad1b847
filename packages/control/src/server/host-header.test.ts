/**
 * An ambiguous host on a real control server (embedded PostgreSQL, real sockets): two Host
 * headers over HTTP/1.1, or over h2c a Host that differs from :authority (or two Hosts), answer
 * 400 before any route reads one of them: REST, the preview proxy's host form, the S3 endpoint and
 * WebSocket upgrades alike. Node would keep the first Host; a proxy in front may have used another.
 */
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import { connect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../testing/server.ts";
import type { UntypedJson } from "../casts.ts";

const DOMAIN = "preview.localhost";
const TWO_HOSTS = "The request has more than one Host header";

describe("ambiguous Host headers", () => {
  let t: TestServer;
  let api: string;

  beforeAll(async () => {
    t = await startTestServer({ settings: { previewDomain: DOMAIN } });
    api = `127.0.0.1:${t.server.port}`;
  }, 120_000);
  afterAll(async () => {
    await t?.stop();
  });

  /** Writes `text` on a connection of its own and collects everything answered until the server closes it. */
  function raw(text: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const s = connect(t.server.port, "127.0.0.1");
      const got: Buffer[] = [];
      const timer = setTimeout(() => {
        s.destroy();
        reject(new Error(`the server did not close the connection; it answered: ${Buffer.concat(got).toString("latin1")}`));
      }, 10_000);
      s.on("data", (c: Buffer) => got.push(c));
      s.on("error", () => {});
      s.on("close", () => {
        clearTimeout(timer);
        resolve(Buffer.concat(got).toString("latin1"));
      });
      s.write(text);
    });
  }

  const bodyOf = (answer: string) => JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4));

  it("HTTP/1.1: two Host headers answer 400 on REST, the preview host form, the S3 endpoint and upgrades", async () => {
    // One Host: answered as usual (the case below differs only by the second header).
    expect(await raw(`GET /api/config HTTP/1.1\r\nHost: ${api}\r\nConnection: close\r\n\r\n`)).toMatch(/^HTTP\/1\.1 200 /);
    const preview = `8000-${randomUUID()}.${DOMAIN}:${t.server.port}`;
    for (const [what, request] of [
      ["REST", `GET /api/config HTTP/1.1\r\nHost: ${api}\r\nHost: evil.example\r\n`],
      ["REST, differing case", `GET /api/config HTTP/1.1\r\nhost: ${api}\r\nHOST: ${api}\r\n`],
      ["REST, a preview host second", `GET /api/config HTTP/1.1\r\nHost: ${api}\r\nHost: ${preview}\r\n`],
      ["preview host form", `GET /index.html HTTP/1.1\r\nHost: ${preview}\r\nHost: ${api}\r\n`],
      ["S3 endpoint", `GET /s3/contexts/some-key HTTP/1.1\r\nHost: ${api}\r\nHost: evil.example\r\n`],
      ["POST with a body", `POST /api/api-keys HTTP/1.1\r\nHost: ${api}\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`],
      [
        "WebSocket upgrade",
        `GET /api/toolbox/sbx-none/toolbox/process/pty/x/connect HTTP/1.1\r\nHost: ${api}\r\nHost: evil.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
          `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n`,
      ],
      [
        "WebSocket upgrade, preview host form",
        `GET /ws HTTP/1.1\r\nHost: ${preview}\r\nHost: ${api}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n`,
      ],
    ]) {
      // No Connection: close: the server closes the connection itself after this answer.
      const answer = await raw(request!.includes("\r\n\r\n") ? request! : request + "\r\n");
      expect(answer, what).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      expect(answer, what).toMatch(/\r\nconnection: close\r\n/i);
      expect(bodyOf(answer), what).toMatchObject({ statusCode: 400, error: "Bad Request", message: TWO_HOSTS });
    }
  });

  /** One h2c request with prior knowledge (node:http2): status and JSON body. */
  async function h2(headers: http2.OutgoingHttpHeaders): Promise<{ status: number; body: UntypedJson }> {
    const session = http2.connect(`http://${api}`);
    try {
      return await new Promise((resolve, reject) => {
        session.on("error", reject);
        const req = session.request({ ":method": "GET", ...headers });
        if (headers[":method"] === "POST") req.write("{}");
        let status = 0;
        const chunks: Buffer[] = [];
        req.on("response", (h) => (status = Number(h[":status"])));
        req.on("data", (c: Buffer) => chunks.push(c));
        req.on("end", () => resolve({ status, body: JSON.parse(Buffer.concat(chunks).toString() || "null") }));
        req.on("error", reject);
        req.end();
      });
    } finally {
      session.close();
    }
  }

  it("HTTP/2: a Host that differs from :authority answers 400; one that agrees is served", async () => {
    // Served alike with no Host or an agreeing one (a Connect call: the API's h2 clients are RPC clients).
    const getConfig = { ":method": "POST", ":path": "/sandbar.control.v1.ConfigService/GetConfig", "content-type": "application/json" };
    expect((await h2({ ...getConfig, ":authority": api })).status).toBe(200);
    expect((await h2({ ...getConfig, ":authority": api, host: api.toUpperCase() })).status).toBe(200);
    const differing = await h2({ ...getConfig, ":authority": api, host: "evil.example" });
    expect(differing.status).toBe(400);
    expect(differing.body).toMatchObject({ statusCode: 400, message: "The request's Host header differs from its :authority" });
    const preview = `8000-${randomUUID()}.${DOMAIN}:${t.server.port}`;
    for (const [authority, host, path] of [
      [api, "evil.example", "/api/config"],
      [api, preview, "/api/config"], // the preview proxy reads Host first, the API's routing the path
      [preview, api, "/index.html"],
      [api, "evil.example", "/s3/contexts/some-key"],
    ]) {
      const res = await h2({ ":path": path!, ":authority": authority!, host: host! });
      expect(res.status, `${authority} / ${host}`).toBe(400);
      expect(res.body, `${authority} / ${host}`).toMatchObject({ statusCode: 400, error: "Bad Request", message: "The request's Host header differs from its :authority" });
    }
  });

  it("HTTP/2: two Host headers are refused, never served (frames written by hand: node's client refuses to send them)", async () => {
    // HPACK "literal header field without indexing, new name", no Huffman: 0x00, length, name, length, value.
    const literal = (name: string, value: string) => Buffer.concat([Buffer.from([0, name.length]), Buffer.from(name), Buffer.from([value.length]), Buffer.from(value)]);
    const frame = (type: number, flags: number, stream: number, payload: Buffer) => {
      const head = Buffer.alloc(9);
      head.writeUIntBE(payload.length, 0, 3);
      head[3] = type;
      head[4] = flags;
      head.writeUInt32BE(stream, 5);
      return Buffer.concat([head, payload]);
    };
    const block = Buffer.concat([literal(":method", "GET"), literal(":scheme", "http"), literal(":path", "/api/config"), literal("host", api), literal("host", "evil.example")]);
    // How stream 1 ends: reset (with its error code) or answered (with the DATA it carried).
    const end = await new Promise<{ reset?: number; data?: string }>((resolve, reject) => {
      const s = connect(t.server.port, "127.0.0.1");
      let buf = Buffer.alloc(0);
      let data = "";
      const timer = setTimeout(() => {
        s.destroy();
        reject(new Error(`stream 1 did not end; got data ${JSON.stringify(data)}`));
      }, 10_000);
      const done = (r: { reset?: number; data?: string }) => {
        clearTimeout(timer);
        s.destroy();
        resolve(r);
      };
      s.on("error", reject);
      s.on("data", (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        while (buf.length >= 9 && buf.length >= 9 + buf.readUIntBE(0, 3)) {
          const [length, type, flags, stream] = [buf.readUIntBE(0, 3), buf[3]!, buf[4]!, buf.readUInt32BE(5) & 0x7fffffff];
          const payload = buf.subarray(9, 9 + length);
          buf = buf.subarray(9 + length);
          if (stream !== 1) continue;
          if (type === 3) return done({ reset: payload.readUInt32BE(0) }); // RST_STREAM
          if (type === 0) data += payload.toString();
          if (flags & 1) return done({ data }); // END_STREAM
        }
      });
      s.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, 0, Buffer.alloc(0)), frame(1, 0x5, 1, block)]));
    });
    // nghttp2 resets such a stream itself (PROTOCOL_ERROR); were it to let one through, the listener answers 400.
    if (end.reset !== undefined) expect(end.reset).toBe(1);
    else expect(JSON.parse(end.data!)).toMatchObject({ statusCode: 400, error: "Bad Request", message: TWO_HOSTS });
  });
});
