import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import type { Duplex } from "node:stream";
import { join } from "node:path";
import { startAgent, type Agent } from "@sandbar/agent";
import { tunnelSocketBeside } from "@sandbar/protocol/tunnel";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dialTunnel, TunnelError } from "./tunnel-dial.ts";
import { freePort } from "@sandbar/runner/free-port";
import { eventually } from "../../../protocol/src/testing/eventually.ts";

// The agent's byte tunnel, end to end on this host: a real agent (in this process) on a unix
// socket, real TCP servers on loopback standing for what runs in a sandbox. (In a sandbox the
// agent's loopback is the sandbox's own; preview.test.ts covers that.)

let dir: string;
let agent: Agent;
let tunnel: string;
const secret = randomBytes(32).toString("hex");
const servers: Server[] = [];

async function tcpServer(onConnection: (s: Socket) => void, allowHalfOpen = true): Promise<number> {
  const server = createServer({ allowHalfOpen }, onConnection);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return (server.address() as AddressInfo).port;
}

function readAll(s: Duplex): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    s.on("data", (c: Buffer) => chunks.push(c));
    s.once("end", () => resolve(Buffer.concat(chunks)));
    s.once("error", reject);
  });
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sandbar-tunnel-"));
  const socketPath = join(dir, "agent.sock");
  agent = await startAgent({ socketPath, secret, stateDir: join(dir, "state"), log: () => {} });
  tunnel = tunnelSocketBeside(socketPath);
});

/** The agent's tunnel socket as the runtime dials it. */
const dial = () => ({ secret, tunnel: () => connect({ path: tunnel, allowHalfOpen: true }) });

afterAll(async () => {
  for (const s of servers) s.close();
  await agent?.close();
  await rm(dir, { recursive: true, force: true });
});

describe("the agent's tunnel", () => {
  it("carries bytes both ways and passes a half-close on: the server answers after the client's end", async () => {
    // Reads everything until the client's FIN, then answers with its length: needs a half-open tunnel.
    const port = await tcpServer((s) => readAll(s).then((all) => s.end(`got ${all.length} bytes`)));
    const s = await dialTunnel(dial(), port);
    s.resume();
    const answer = readAll(s);
    s.end(Buffer.alloc(300_000, 1));
    expect((await answer).toString()).toBe("got 300000 bytes");
  });

  it("hands over what the server sends first (server-speaks-first protocols)", async () => {
    const port = await tcpServer((s) => s.end("220 hello\r\n"));
    const s = await dialTunnel(dial(), port);
    s.resume();
    expect((await readAll(s)).toString()).toBe("220 hello\r\n");
  });

  it("reaches a server bound to ::1 only (a `localhost` server that chose IPv6)", async (ctx) => {
    const server = createServer((s) => s.end("v6"));
    servers.push(server);
    const listening = await new Promise<boolean>((resolve) => {
      server.once("error", () => resolve(false));
      // A port free on 127.0.0.1 and outside the kernel's ephemeral range: a kernel-picked port on
      // ::1 can be taken on 127.0.0.1 by another suite's server, which the tunnel then reaches first.
      void freePort().then((port) => server.listen(port, "::1", () => resolve(true)));
    });
    if (!listening) return ctx.skip(); // no IPv6 loopback on this host
    const s = await dialTunnel(dial(), (server.address() as AddressInfo).port);
    s.resume();
    expect((await readAll(s)).toString()).toBe("v6");
  });

  it("refuses a wrong secret, a port nobody listens on, and a malformed header, each with its reason", async () => {
    const port = await tcpServer((s) => s.end());
    await expect(dialTunnel({ ...dial(), secret: "wrong" }, port)).rejects.toMatchObject({ reason: "auth" });
    const closed = await tcpServer(() => {});
    await new Promise((r) => servers.pop()!.close(r));
    const refused = await dialTunnel(dial(), closed).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TunnelError);
    expect(refused).toMatchObject({ reason: "refused", message: `nothing listens on port ${closed}` });
    // A raw client that speaks no tunnel header gets a refusal, not a connection.
    const { connect } = await import("node:net");
    const raw = connect(tunnel);
    raw.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    expect((await readAll(raw)).toString()).toBe("ERR bad-request malformed tunnel header\n");
  });

  it("keeps back-pressure: a reader that does not read holds the sender at a bounded amount in flight", async () => {
    let written = 0;
    let draining = false;
    const port = await tcpServer((s) => {
      s.on("error", () => {});
      const chunk = Buffer.alloc(64 * 1024);
      const pump = () => {
        draining = false;
        while (written < 512 * 1024 * 1024) {
          written += chunk.length;
          if (!s.write(chunk)) return void ((draining = true), s.once("drain", pump));
        }
        s.end();
      };
      pump();
    });
    const s = await dialTunnel(dial(), port);
    // Not reading: the server comes to wait for a drain that does not come (no progress between
    // two looks), far below the 512 MB it wants to send.
    let seen = -1;
    await eventually("the sender to be held", () => {
      const held = draining && written === seen;
      seen = written;
      return held;
    });
    expect(written).toBeLessThan(64 * 1024 * 1024);
    s.destroy();
  });

  it("passes the client's going away on: a server that ends on end closes", async () => {
    let closedAtServer!: () => void;
    const serverSawClose = new Promise<void>((r) => (closedAtServer = r));
    const port = await tcpServer((s) => {
      s.on("error", () => {});
      s.once("close", () => closedAtServer());
      s.resume();
    }, false);
    const s = await dialTunnel(dial(), port);
    s.destroy();
    await serverSawClose;
  });
});
