/**
 * Connection caps and timeouts on a real control server (embedded PostgreSQL, real sockets).
 * Clients pick their source among 127.0.0.0/8 (all local on Linux) to be different addresses;
 * 127.0.0.1 itself is exempt from the per-address cap (local proxies and tools). Each slowloris
 * kind must be closed within a few times its (shortened) timeout: the deadlines wait for the
 * socket's close and fail past them.
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import http, { type Agent } from "node:http";
import http2 from "node:http2";
import { connect, type Socket } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "@sandbar/protocol/gen/grpc/health/v1/health_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../testing/server.ts";
import { addressKey, defaultMaxConnections, loadConnectionSettings } from "./connection-limits.ts";
import { openFilesLimit } from "./open-files.ts";
import { proxyV2 } from "./testing/proxy-headers.ts";

const HEADERS_MS = 500;
const BODY_MS = 1000;
const IDLE_MS = 1200;
/** A timeout has this many times its setting to act (the check runs every quarter of it; the machine is shared). */
const SLACK = 6;

/** A raw client connection: what it received, and a promise of its close. */
interface Probe {
  socket: Socket;
  closed: Promise<void>;
  isClosed(): boolean;
  received(): string;
}

function probe(port: number, localAddress = "127.0.0.1", first?: string | Buffer): Probe {
  const socket = connect({ host: "127.0.0.1", port, localAddress });
  const chunks: Buffer[] = [];
  let closed = false;
  socket.on("data", (c: Buffer) => chunks.push(c));
  socket.on("error", () => {});
  if (first !== undefined) socket.write(first);
  return {
    socket,
    closed: new Promise((resolve) =>
      socket.once("close", () => {
        closed = true;
        resolve();
      }),
    ),
    isClosed: () => closed,
    received: () => Buffer.concat(chunks).toString("latin1"),
  };
}

/** `promise`, or a failure naming `what` once `ms` passed. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Writes `text` a byte every `everyMs` until the socket closes or the text is out. */
function trickle(socket: Socket, text: string, everyMs = 50): void {
  let i = 0;
  const timer = setInterval(() => {
    if (socket.destroyed || !socket.writable || i >= text.length) return clearInterval(timer);
    socket.write(text[i++]!);
  }, everyMs);
  socket.once("close", () => clearInterval(timer));
}

/** Resolves once `p` has received a whole HTTP/1.1 answer's head. */
const answered = (p: Probe) => new Promise<void>((resolve) => {
  const check = () => (p.received().includes("\r\n\r\n") ? (p.socket.off("data", check), resolve()) : undefined);
  p.socket.on("data", check);
  check();
});

/** One HTTP/1.1 request from `localAddress` (a connection of its own unless `agent`). */
function get(port: number, path: string, opts: { localAddress?: string; key?: string; agent?: Agent } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port, path, localAddress: opts.localAddress, agent: opts.agent ?? false, headers: opts.key ? { authorization: `Bearer ${opts.key}` } : {} },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

describe("connection settings", () => {
  it("reads the settings, with defaults; the global cap's default is half the open-files limit", () => {
    expect(loadConnectionSettings({})).toEqual({ maxConnections: undefined, maxConnectionsPerAddress: 256, headersTimeoutMs: 20_000, idleTimeoutMs: 65_000, bodyTimeoutMs: 60_000 });
    expect(loadConnectionSettings({ SANDBAR_MAX_CONNECTIONS: "5000", SANDBAR_MAX_CONNECTIONS_PER_ADDRESS: "0", SANDBAR_IDLE_TIMEOUT_MS: "120000" })).toMatchObject({ maxConnections: 5000, maxConnectionsPerAddress: 0, idleTimeoutMs: 120_000 });
    expect(() => loadConnectionSettings({ SANDBAR_MAX_CONNECTIONS: "0" })).toThrow(/SANDBAR_MAX_CONNECTIONS must be a whole number >= 1/);
    expect(() => loadConnectionSettings({ SANDBAR_HEADERS_TIMEOUT_MS: "1.5" })).toThrow(/SANDBAR_HEADERS_TIMEOUT_MS/);
    expect(defaultMaxConnections(20_000)).toBe(10_000);
    expect(defaultMaxConnections(1_048_576)).toBe(65_536);
    expect(defaultMaxConnections(100)).toBe(64);
  });

  it("counts an IPv4 client by its address and an IPv6 client by its /64", () => {
    expect(addressKey("203.0.113.7")).toBe("203.0.113.7");
    expect(addressKey("2001:db8:1:2:aaaa::1")).toBe("2001:db8:1:2::/64");
    expect(addressKey("2001:db8:1:2:bbbb:cccc:dddd:eeee")).toBe("2001:db8:1:2::/64");
    expect(addressKey("2001:db8::1")).toBe("2001:db8:0:0::/64");
    expect(addressKey("fe80::1%eth0")).toBe("fe80:0:0:0::/64");
    expect(addressKey("::1")).toBe("0:0:0:0::/64");
  });
});

describe("timeouts on the one port", () => {
  let t: TestServer;
  let port: number;
  const agents: Agent[] = [];

  beforeAll(async () => {
    t = await startTestServer({ settings: { connections: { maxConnectionsPerAddress: 256, headersTimeoutMs: HEADERS_MS, idleTimeoutMs: IDLE_MS, bodyTimeoutMs: BODY_MS } } });
    port = t.server.port;
  }, 120_000);
  afterAll(async () => {
    agents.forEach((a) => a.destroy());
    await t?.stop();
  });

  it("a connection that sends nothing is closed after the headers timeout", async () => {
    const p = probe(port);
    await within(p.closed, SLACK * HEADERS_MS, "idle connection closed");
    expect(p.received()).toBe("");
  });

  it("a head sent a byte at a time is answered 408 and closed", async () => {
    const p = probe(port);
    trickle(p.socket, "GET /api/config HTTP/1.1\r\nHost: x\r\nX-Pad: " + "a".repeat(200) + "\r\n\r\n");
    await within(p.closed, SLACK * HEADERS_MS, "slow head closed");
    expect(p.received()).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
    expect(p.received()).toContain('"statusCode":408');
  });

  it("a partial request line is answered 408 and closed", async () => {
    const p = probe(port, "127.0.0.1", "GET /api/con");
    await within(p.closed, SLACK * HEADERS_MS, "partial request line closed");
    expect(p.received()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it("a kept-alive connection's next head has the same deadline (Node's own check, started by the listener)", async () => {
    const p = probe(port, "127.0.0.1", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
    await within(answered(p), 10_000, "first answer");
    expect(p.received()).toMatch(/^HTTP\/1\.1 200 /);
    const before = p.received().length;
    p.socket.write("GET /api/config HTTP/1.1\r\nHo");
    await within(p.closed, SLACK * HEADERS_MS, "second, partial head closed");
    expect(p.received().slice(before)).toMatch(/^HTTP\/1\.1 408 /);
  });

  it("an idle kept-alive connection is closed after the idle timeout", async () => {
    const p = probe(port, "127.0.0.1", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
    await within(answered(p), 10_000, "answer");
    expect(p.received()).toMatch(/Keep-Alive: timeout=1\r\n/);
    // Node adds a second to what it advertises, so that clients close first.
    await within(p.closed, SLACK * IDLE_MS, "idle kept-alive connection closed");
  });

  it("a stalled HTTP/2 preface, or a preface without SETTINGS, is closed after the headers timeout", async () => {
    const partial = probe(port, "127.0.0.1", "PRI * HTTP/2.0\r\n");
    const noSettings = probe(port, "127.0.0.1", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    await within(Promise.all([partial.closed, noSettings.closed]), SLACK * HEADERS_MS, "stalled prefaces closed");
  });

  it("a body trickled a byte at a time, with a key, is answered 408 and closed", async () => {
    const head = `POST /api/api-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.adminKey}\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n`;
    const p = probe(port, "127.0.0.1", head + '{"name":"');
    trickle(p.socket, "s".repeat(1000));
    await within(p.closed, SLACK * BODY_MS, "slow body closed");
    expect(p.received()).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
  });

  it("a body trickled without a key: answered 401 at once, then closed when the rest stalls (not drained forever)", async () => {
    const head = `POST /api/api-keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n`;
    const p = probe(port, "127.0.0.1", head + '{"name":"');
    trickle(p.socket, "s".repeat(10_000));
    await within(p.closed, SLACK * BODY_MS, "slow body without a key closed");
    expect(p.received()).toMatch(/^HTTP\/1\.1 401 /);
  });

  it("HTTP/2: a stream whose body stalls is reset; an idle session is closed", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => {});
    const closed = once(session, "close");
    const stream = session.request({ ":method": "POST", ":path": "/api/api-keys", authorization: `Bearer ${t.adminKey}`, "content-type": "application/json", "content-length": "2000" }, { endStream: false });
    stream.on("error", () => {});
    stream.resume();
    stream.write('{"name":"');
    await within(once(stream, "close"), SLACK * BODY_MS, "stalled stream reset");
    expect(stream.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);
    // No stream open any more: the session is idle.
    await within(closed, SLACK * IDLE_MS, "idle session closed");
  });

  it("quiet server streams (gRPC over HTTP/2, Connect over HTTP/1.1) outlive the idle and body timeouts", async () => {
    const base = `http://127.0.0.1:${port}`;
    const grpc = createClient(Health, createGrpcTransport({ baseUrl: base }));
    const connect11 = createClient(Health, createConnectTransport({ baseUrl: base, httpVersion: "1.1" }));
    const abort = new AbortController();
    const watch = (client: typeof grpc) => {
      const it = client.watch({}, { signal: abort.signal })[Symbol.asyncIterator]();
      const state = { ended: false };
      const first = it.next();
      const rest = first.then(() => it.next()).finally(() => (state.ended = true));
      rest.catch(() => {});
      return { first, state, rest };
    };
    const overH2 = watch(grpc);
    const overH1 = watch(connect11);
    expect((await overH2.first).value?.status).toBe(Serving.SERVING);
    expect((await overH1.first).value?.status).toBe(Serving.SERVING);

    // Canaries opened now: a kept-alive HTTP/1.1 connection and an HTTP/2 session, both idle.
    // Once the server has closed them, the idle (and the shorter body) timeout has passed.
    const canary1 = probe(port, "127.0.0.1", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
    const canary2 = http2.connect(base);
    canary2.on("error", () => {});
    const canary2Closed = once(canary2, "close");
    const warm = canary2.request({ ":path": "/api/config" });
    warm.resume();
    await once(warm, "close");
    await within(Promise.all([canary1.closed, canary2Closed]), SLACK * IDLE_MS + 2000, "idle canaries closed");

    expect(overH2.state.ended).toBe(false);
    expect(overH1.state.ended).toBe(false);
    // The watch's session is still there for another call.
    expect((await grpc.check({})).status).toBe(Serving.SERVING);
    abort.abort();
    await expect(overH2.rest).rejects.toThrow();
    await expect(overH1.rest).rejects.toThrow();
  });

  it("an upload that keeps progressing outlives the idle and body timeouts", async () => {
    const canary = probe(port, "127.0.0.1", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
    const result = new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(
        { host: "127.0.0.1", port, method: "POST", path: "/api/api-keys", agent: false, headers: { authorization: `Bearer ${t.adminKey}`, "content-type": "application/json" } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        },
      );
      req.on("error", reject);
      // Chunked: 2 KiB of JSON whitespace every 100 ms (more than the 1 KiB per body timeout
      // asked), until the idle canary is closed, then the rest of the object.
      req.write('{"name":"slow-upload",');
      const timer = setInterval(() => {
        if (!canary.isClosed()) return void req.write(" ".repeat(2048));
        clearInterval(timer);
        req.end('"permissions":[]}');
      }, 100);
    });
    const answer = await within(result, SLACK * IDLE_MS + 10_000, "slow upload answered");
    expect(answer.status, answer.body).toBe(201);
    expect(JSON.parse(answer.body).name).toBe("slow-upload");
  });
});

describe("connection caps on the one port", () => {
  const PER_ADDRESS = 20;
  const MAX = 150;
  const LB = "127.0.0.9";
  let t: TestServer;
  let port: number;
  const open: Socket[] = [];

  beforeAll(async () => {
    t = await startTestServer({
      settings: {
        proxyProtocolFrom: [`${LB}/32`],
        // Timeouts far off: the flood must stay while the test looks.
        connections: { maxConnections: MAX, maxConnectionsPerAddress: PER_ADDRESS, headersTimeoutMs: 120_000, idleTimeoutMs: 120_000, bodyTimeoutMs: 120_000 },
      },
    });
    port = t.server.port;
  }, 120_000);
  afterAll(async () => {
    open.forEach((s) => s.destroy());
    await t?.stop();
  });

  /** `n` idle connections from `from` (each optionally starting with `first`); resolves once all are connected. */
  async function flood(n: number, from: string, first?: Buffer): Promise<Probe[]> {
    const probes = Array.from({ length: n }, () => probe(port, from, first));
    open.push(...probes.map((p) => p.socket));
    await Promise.all(probes.map((p) => (p.isClosed() ? undefined : once(p.socket, "connect").catch(() => undefined))));
    return probes;
  }
  const closedCount = (probes: Probe[]) => probes.filter((p) => p.isClosed()).length;
  /** Resolves once `n` of `probes` are closed. */
  const untilClosed = (probes: Probe[], n: number) => new Promise<void>((resolve) => {
    const check = () => (closedCount(probes) >= n ? resolve() : undefined);
    probes.forEach((p) => void p.closed.then(check));
    check();
  });

  it("a flood of 10x the per-address cap from one address: the cap's worth stays, the rest is reset at once; other addresses are served", async () => {
    const probes = await flood(10 * PER_ADDRESS, "127.0.0.3");
    await within(untilClosed(probes, 9 * PER_ADDRESS), 10_000, "connections over the cap closed");
    // A further one from the same address is refused before its request is read...
    const more = probe(port, "127.0.0.3", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
    await within(more.closed, 10_000, "one more closed");
    expect(more.received()).toBe("");
    // ...while another address gets answers, anonymous and authenticated.
    expect((await get(port, "/api/config", { localAddress: "127.0.0.2" })).status).toBe(200);
    const current = await get(port, "/api/api-keys/current", { localAddress: "127.0.0.2", key: t.adminKey });
    expect(current.status, current.body).toBe(200);
    // The cap's worth from the flooding address is still open (idle, within its timeouts).
    expect(closedCount(probes)).toBe(9 * PER_ADDRESS);
    probes.forEach((p) => p.socket.destroy());
  });

  it("127.0.0.1 (local proxies and tools) is not capped per address", async () => {
    const probes = await flood(PER_ADDRESS + 5, "127.0.0.1");
    // Accepted in order: an answer on the next one means every earlier one was let in.
    expect((await get(port, "/api/config", { localAddress: "127.0.0.1" })).status).toBe(200);
    expect(closedCount(probes)).toBe(0);
    probes.forEach((p) => p.socket.destroy());
  });

  it("behind a PROXY protocol balancer, each stated client is capped, not the balancer", async () => {
    const probes = await flood(PER_ADDRESS + 5, LB, proxyV2("203.0.113.50", 40000));
    await within(untilClosed(probes, 5), 10_000, "stated client's connections over the cap closed");
    // The balancer holds more than the cap itself, and speaks for another client just as well.
    const other = probe(port, LB, Buffer.concat([proxyV2("203.0.113.51", 40001), Buffer.from("GET /api/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")]));
    await within(other.closed, 10_000, "answer for another stated client");
    expect(other.received()).toMatch(/^HTTP\/1\.1 200 /);
    expect(closedCount(probes)).toBe(5);
    probes.forEach((p) => p.socket.destroy());
  });

  it("at the global cap new connections are closed unanswered, established ones keep being served; freed, new ones are served again", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1, localAddress: "127.0.0.2" } as http.AgentOptions);
    try {
      expect((await get(port, "/api/api-keys/current", { agent, key: t.adminKey })).status).toBe(200);
      // Eight addresses at their per-address cap: more than the global cap.
      const probes = (await Promise.all(["4", "5", "6", "7", "8", "10", "11", "12"].map((n) => flood(PER_ADDRESS, `127.0.0.${n}`)))).flat();
      expect(probes.length).toBeGreaterThan(MAX);
      // Accepted after the flood (the kernel hands connections over in order): refused.
      const late = probe(port, "127.0.0.13", "GET /api/config HTTP/1.1\r\nHost: x\r\n\r\n");
      await within(late.closed, 10_000, "a new connection at the cap closed");
      expect(late.received()).toBe("");
      expect(closedCount(probes)).toBeGreaterThan(0);
      // The established client is served.
      const again = await get(port, "/api/api-keys/current", { agent, key: t.adminKey });
      expect(again.status, again.body).toBe(200);
      // Freed: the server sees the closes in its own time, so ask until it answers.
      probes.forEach((p) => p.socket.destroy());
      const served = async (): Promise<number> => {
        for (;;) {
          const r = await get(port, "/api/config", { localAddress: "127.0.0.13" }).catch(() => undefined);
          if (r) return r.status;
        }
      };
      expect(await within(served(), 10_000, "served again once the flood left")).toBe(200);
    } finally {
      agent.destroy();
    }
  });
});

describe("open-files limit", () => {
  it("a process whose soft limit is below its hard limit has it raised (prlimit from util-linux)", async () => {
    const module = new URL("./open-files.ts", import.meta.url).pathname;
    const child = spawn(process.execPath, ["--input-type=module", "-e", `
      import { raiseOpenFilesLimit } from ${JSON.stringify(module)};
      process.stdin.once("data", () => { console.log(JSON.stringify(raiseOpenFilesLimit())); process.exit(0); });
      console.log("ready");
    `], { stdio: ["pipe", "pipe", "inherit"] });
    try {
      let out = "";
      child.stdout.on("data", (c: Buffer) => (out += c.toString()));
      await within(new Promise<void>((r) => child.stdout.on("data", () => out.includes("ready") && r())), 20_000, "child ready");
      const hard = openFilesLimit(child.pid!)!.hard;
      // Node raised it at start; lowered from outside, as another runtime would leave it.
      expect(openFilesLimit(child.pid!)!.soft).toBe(hard);
      const lower = spawn("prlimit", ["--pid", String(child.pid), "--nofile=512:"], { stdio: "inherit" });
      expect((await once(lower, "exit"))[0]).toBe(0);
      expect(openFilesLimit(child.pid!)!.soft).toBe(512);
      child.stdin.write("go\n");
      await within(once(child, "exit"), 20_000, "child done");
      const result = JSON.parse(out.split("\n").find((l) => l.startsWith("{"))!);
      expect(result).toEqual({ soft: hard, hard, raisedFrom: 512 });
    } finally {
      child.kill();
    }
  });
});
