import { BlockList, createServer, connect, type Server, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { peerAddress } from "./client-address.ts";
import { proxyAdmission, readProxyHeader, type HeaderOutcome } from "./proxy-accept.ts";
import { parseProxyHeader, V2_MAX, V2_SIGNATURE } from "./proxy-protocol.ts";
import { proxyV1, proxyV2 } from "./testing/proxy-headers.ts";

const text = (s: string) => Buffer.from(s, "latin1");
const complete = (buf: Buffer) => {
  const r = parseProxyHeader(buf);
  if (r.state !== "complete") throw new Error(`expected a complete header, got ${JSON.stringify(r)}`);
  return r.header;
};
const reason = (buf: Buffer) => {
  const r = parseProxyHeader(buf);
  return r.state === "invalid" ? r.reason : r.state;
};
/** Every proper prefix of a valid header is only "incomplete", never a verdict. */
const everyPrefixIncomplete = (buf: Buffer) => {
  for (let n = 0; n < buf.length; n++) expect(parseProxyHeader(buf.subarray(0, n)).state, `prefix of ${n} bytes`).toBe("incomplete");
};

describe("PROXY protocol v1", () => {
  it("TCP4 and TCP6: the source address and port, the header's length; what follows is not read", () => {
    const h = text("PROXY TCP4 203.0.113.7 10.0.0.1 51234 3000\r\nGET / HTTP/1.1\r\n");
    expect(complete(h)).toEqual({ version: 1, length: 44, source: { address: "203.0.113.7", port: 51234 } });
    expect(complete(text("PROXY TCP6 2001:db8::7 2001:db8::1 65535 443\r\n"))).toEqual({ version: 1, length: 46, source: { address: "2001:db8::7", port: 65535 } });
  });

  it("IPv6 sources are spelled one way (rate-limit keys cannot differ by notation); IPv4-mapped ones as IPv4", () => {
    expect(complete(text("PROXY TCP6 2001:0DB8:0000:0000:0000:0000:0000:0007 ::1 1 2\r\n")).source?.address).toBe("2001:db8::7");
    expect(complete(text("PROXY TCP6 ::ffff:198.51.100.4 ::1 1 2\r\n")).source?.address).toBe("198.51.100.4");
  });

  it("UNKNOWN: complete, no source (the connection's peer counts), whatever follows the keyword", () => {
    expect(complete(text("PROXY UNKNOWN\r\n"))).toEqual({ version: 1, length: 15 });
    expect(complete(text("PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n")).source).toBeUndefined();
  });

  it("truncated anywhere, including between CR and LF: incomplete until the CRLF arrives", () => {
    everyPrefixIncomplete(text("PROXY TCP6 2001:db8::7 2001:db8::1 65535 443\r\n"));
  });

  it("garbage, wrong families, bad ports and malformed lines are invalid with a reason", () => {
    expect(reason(text("GET / HTTP/1.1\r\n"))).toMatch(/does not start with a PROXY protocol header/);
    expect(reason(text("PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n"))).toMatch(/unknown protocol "TCP5"/);
    expect(reason(text("PROXY TCP4 2001:db8::7 1.2.3.4 1 2\r\n"))).toMatch(/not IPv4/);
    expect(reason(text("PROXY TCP6 1.2.3.4 ::1 1 2\r\n"))).toMatch(/not IPv6/);
    expect(reason(text("PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n"))).toMatch(/port/);
    expect(reason(text("PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n"))).toMatch(/port/);
    expect(reason(text("PROXY TCP4 1.2.3.4  1.2.3.4 1 2\r\n"))).toMatch(/expected PROXY/);
    expect(reason(text("PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n"))).toMatch(/expected PROXY/);
    expect(reason(text("PROXY TCP4 1.2.3.4\n1.2.3.4 1 2\r\n"))).toMatch(/control or non-ASCII/);
    expect(reason(Buffer.concat([text("PROXY TCP4 1.2.3.4 "), Buffer.from([0xc3, 0xa9])]))).toMatch(/control or non-ASCII/);
  });

  it("oversized: no CRLF within 107 bytes is refused at once, without waiting for more", () => {
    const long = text("PROXY UNKNOWN " + "x".repeat(120));
    expect(reason(long.subarray(0, 106))).toBe("incomplete");
    expect(reason(long.subarray(0, 107))).toMatch(/no CRLF within 107 bytes/);
    expect(reason(text("PROXY UNKNOWN " + "x".repeat(92) + "\r\n"))).toMatch(/header line of 108 bytes/);
    expect(complete(text("PROXY UNKNOWN " + "x".repeat(91) + "\r\n")).length).toBe(107);
  });
});

describe("PROXY protocol v2", () => {
  it("TCP over IPv4 and IPv6: the source address and port; TLVs after the addresses are skipped", () => {
    expect(complete(proxyV2("203.0.113.7", 40000))).toEqual({ version: 2, length: 28, source: { address: "203.0.113.7", port: 40000 } });
    expect(complete(proxyV2("2001:db8:0:0:1:0:0:7", 1))).toEqual({ version: 2, length: 52, source: { address: "2001:db8::1:0:0:7", port: 1 } });
    expect(complete(proxyV2("::ffff:c633:6404", 9)).source?.address).toBe("198.51.100.4");
    // PP2_TYPE_UNIQUE_ID (0x05) of 3 bytes, as haproxy's `proxy-v2-options unique-id` adds.
    const withTlv = Buffer.concat([proxyV2("192.0.2.1", 80, { tlvs: Buffer.from([0x05, 0x00, 0x03, 0x61, 0x62, 0x63]) }), text("rest")]);
    expect(complete(withTlv)).toEqual({ version: 2, length: 34, source: { address: "192.0.2.1", port: 80 } });
  });

  it("LOCAL (the balancer's own health check), AF_UNSPEC and AF_UNIX: complete, no source", () => {
    expect(complete(proxyV2("203.0.113.7", 1, { local: true }))).toEqual({ version: 2, length: 28 });
    expect(complete(Buffer.concat([V2_SIGNATURE, Buffer.from([0x21, 0x00, 0x00, 0x00])]))).toEqual({ version: 2, length: 16 });
    const unix = Buffer.concat([V2_SIGNATURE, Buffer.from([0x21, 0x31, 0x00, 216]), Buffer.alloc(216)]);
    expect(complete(unix)).toEqual({ version: 2, length: 232 });
  });

  it("truncated anywhere (signature, fixed part, addresses): incomplete", () => {
    everyPrefixIncomplete(proxyV2("2001:db8::7", 443));
    everyPrefixIncomplete(proxyV2("203.0.113.7", 443, { tlvs: Buffer.alloc(100) }));
  });

  it("oversized: a length past 536 bytes in all is refused as soon as the fixed 16 bytes are in", () => {
    const head = (len: number) => Buffer.concat([V2_SIGNATURE, Buffer.from([0x21, 0x11, len >> 8, len & 0xff])]);
    expect(reason(head(V2_MAX - 16 + 1))).toMatch(/header of 537 bytes \(at most 536\)/);
    expect(reason(head(0xffff))).toMatch(/at most 536/);
    expect(complete(Buffer.concat([head(V2_MAX - 16), Buffer.alloc(V2_MAX - 16)])).length).toBe(V2_MAX);
  });

  it("wrong version, command, family, transport or a short address block: invalid with a reason", () => {
    const fixed = (verCmd: number, fam: number, len = 12) => Buffer.concat([V2_SIGNATURE, Buffer.from([verCmd, fam, 0, len]), Buffer.alloc(len)]);
    expect(reason(fixed(0x11, 0x11))).toMatch(/version 1/);
    expect(reason(fixed(0x22, 0x11))).toMatch(/unknown command 2/);
    expect(reason(fixed(0x21, 0x41))).toMatch(/unknown address family/);
    expect(reason(fixed(0x21, 0x13))).toMatch(/unknown address family/);
    expect(reason(fixed(0x21, 0x12))).toMatch(/datagram/);
    expect(reason(fixed(0x21, 0x11, 11))).toMatch(/address block of 11 bytes for IPv4/);
    expect(reason(fixed(0x21, 0x21, 12))).toMatch(/address block of 12 bytes for IPv6/);
    // The signature's bytes, one wrong: not a v2 header (nor v1).
    const bad = proxyV2("203.0.113.7", 1);
    bad[5] = 0x01;
    expect(reason(bad)).toMatch(/does not start with a PROXY protocol header/);
    // An HTTP/2 preface or TLS ClientHello is not a header.
    expect(reason(text("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))).toMatch(/does not start/);
    expect(reason(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00]))).toMatch(/does not start/);
  });
});

describe("readProxyHeader on a real socket", () => {
  let server: Server;
  let port: number;
  let accepted: (s: Socket) => void;
  beforeAll(async () => {
    server = createServer((s) => accepted(s));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  /** Connects, writes `parts` one by one with a pause between (separate TCP segments), reads the header server-side. */
  async function exchange(parts: Buffer[], opts: { timeoutMs?: number; end?: boolean } = {}): Promise<{ outcome: HeaderOutcome; after: Buffer }> {
    const serverSide = new Promise<Socket>((r) => (accepted = r));
    const client = connect(port, "127.0.0.1");
    client.setNoDelay(true);
    const s = await serverSide;
    const reading = readProxyHeader(s, opts.timeoutMs ?? 2000);
    for (const p of parts) {
      client.write(p);
      await new Promise((r) => setTimeout(r, 15));
    }
    if (opts.end) client.end();
    const outcome = await reading;
    // What followed the header is still there for the protocol's own server, in order.
    const after: Buffer[] = [];
    if (outcome.ok) {
      s.on("data", (c: Buffer) => after.push(c));
      s.resume();
      client.end();
      await new Promise((r) => s.once("end", r));
    }
    client.destroy();
    s.destroy();
    return { outcome, after: Buffer.concat(after) };
  }

  it("a header split into one-byte packets, followed by the request: the header read, the request left intact", async () => {
    const header = proxyV2("2001:db8::42", 6000);
    const request = text("GET /api/config HTTP/1.1\r\nhost: x\r\n\r\n");
    const parts = [...header].map((b) => Buffer.from([b]));
    parts[parts.length - 1] = Buffer.concat([parts.at(-1)!, request.subarray(0, 5)]);
    parts.push(request.subarray(5));
    const { outcome, after } = await exchange(parts);
    expect(outcome).toEqual({ ok: true, header: { version: 2, length: 52, source: { address: "2001:db8::42", port: 6000 } } });
    expect(after.toString("latin1")).toBe(request.toString("latin1"));
  });

  it("a v1 header and the HTTP/2 preface in one packet: split exactly at the CRLF", async () => {
    const preface = text("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    const { outcome, after } = await exchange([Buffer.concat([proxyV1("198.51.100.9", 1234), preface])]);
    expect(outcome).toMatchObject({ ok: true, header: { version: 1, source: { address: "198.51.100.9", port: 1234 } } });
    expect(after.equals(preface)).toBe(true);
  });

  it("garbage is refused at its first telling byte; a peer that never finishes times out; one that closes mid-header is reported", async () => {
    expect((await exchange([text("GET / HTTP/1.1\r\n\r\n")])).outcome).toMatchObject({ ok: false, reason: expect.stringMatching(/does not start/) });
    // The peer neither finishes nor closes: only the timeout can end the read.
    expect((await exchange([proxyV2("203.0.113.7", 1).subarray(0, 10)], { timeoutMs: 300 })).outcome).toMatchObject({ ok: false, received: 10, reason: "no complete PROXY header within 300 ms" });
    expect((await exchange([text("PROXY TCP4 1.2")], { end: true })).outcome).toMatchObject({ ok: false, received: 14, reason: "closed in the middle of the PROXY header" });
    expect((await exchange([], { end: true })).outcome).toMatchObject({ ok: false, received: 0, reason: "closed before sending anything" });
  });
});

describe("proxyAdmission", () => {
  let server: Server;
  let port: number;
  const lines: string[] = [];
  const results: Array<{ admitted: boolean; peer: string }> = [];
  beforeAll(async () => {
    const from = new BlockList();
    from.addAddress("127.0.0.1");
    const admit = proxyAdmission({ from, timeoutMs: 300, log: (l) => lines.push(l) });
    server = createServer((s) =>
      void admit(s).then((admitted) => {
        results.push({ admitted, peer: peerAddress(s) });
        s.destroy();
      }),
    );
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  const attempt = async (from: string, bytes: Buffer | undefined) => {
    const n = results.length;
    const c = connect({ port, host: "127.0.0.1", localAddress: from });
    c.on("error", () => {});
    await new Promise((r) => c.once("connect", r));
    if (bytes) c.write(bytes);
    else c.end();
    await eventually("the admission's verdict", () => results.length > n);
    c.destroy();
    return results.at(-1)!;
  };

  it("a listed peer's header becomes the socket's peer address; an unlisted peer's bytes are not read", async () => {
    expect(await attempt("127.0.0.1", proxyV2("203.0.113.5", 1))).toEqual({ admitted: true, peer: "203.0.113.5" });
    expect(await attempt("127.0.0.1", proxyV2("203.0.113.5", 1, { local: true }))).toEqual({ admitted: true, peer: "127.0.0.1" });
    expect(await attempt("127.0.0.2", proxyV2("203.0.113.5", 1))).toEqual({ admitted: true, peer: "127.0.0.2" });
  });

  it("a bad header, a silent peer and a half header are dropped and logged once per peer; a connect-only health check is not logged", async () => {
    expect(lines).toEqual([]);
    expect(await attempt("127.0.0.1", undefined)).toEqual({ admitted: false, peer: "127.0.0.1" });
    expect(lines).toEqual([]);
    expect((await attempt("127.0.0.1", Buffer.from("GET / HTTP/1.1\r\n\r\n"))).admitted).toBe(false);
    expect((await attempt("127.0.0.1", proxyV2("203.0.113.5", 1).subarray(0, 20))).admitted).toBe(false);
    expect(lines).toEqual(["PROXY protocol: dropped a connection from 127.0.0.1: the connection does not start with a PROXY protocol header (further ones from 127.0.0.1 are not logged)"]);
  });
});
