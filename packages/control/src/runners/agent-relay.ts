import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Duplex } from "node:stream";

// Why a relay: control's HTTP/2 clients of an agent need a real socket under them. Node runs
// HTTP/2 over any other Duplex (here the HTTP/2 stream to the runner) through a JS shim, and an
// agent session nested that way lost its connection under load (ERR_STREAM_PREMATURE_CLOSE on
// uploads). So each agent connection is a unix socket to this relay, in a 0700 directory of its
// own, which sends the sandbox id as its first line and then pipes bytes to a stream the runner
// opens to that sandbox's agent. The bytes are never looked at or buffered beyond the line.

const MAX_LINE = 64;

export class AgentRelay {
  readonly path: string;
  readonly #server: Server;
  readonly #dir: string;

  private constructor(dir: string, server: Server) {
    this.#dir = dir;
    this.path = path.join(dir, "relay.sock");
    this.#server = server;
  }

  /** `open(sandboxId)`: the stream to that sandbox's agent through the runner. */
  static async start(open: (sandboxId: string) => Duplex): Promise<AgentRelay> {
    const dir = await mkdtemp(path.join(tmpdir(), "sandbar-relay-"));
    const server = createServer((socket) => relay(socket, open));
    const r = new AgentRelay(dir, server);
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(r.path, () => resolve());
    });
    server.unref();
    return r;
  }

  /** A connection to the sandbox's agent: a real socket, usable at once. */
  connect(sandboxId: string): Socket {
    const { connect } = process.getBuiltinModule("node:net");
    const s = connect(this.path);
    // The relay resets this socket when the runner goes away; its HTTP/2 session may be gone by then.
    s.on("error", () => undefined);
    s.write(sandboxId + "\n");
    return s;
  }

  async close(): Promise<void> {
    await new Promise<void>((r) => this.#server.close(() => r()));
    await rm(this.#dir, { recursive: true, force: true });
  }
}

function relay(socket: Socket, open: (sandboxId: string) => Duplex): void {
  let head = Buffer.alloc(0);
  socket.on("error", () => socket.destroy());
  const onData = (chunk: Buffer) => {
    head = Buffer.concat([head, chunk]);
    const nl = head.indexOf(10);
    if (nl < 0) {
      if (head.length > MAX_LINE) socket.destroy();
      return;
    }
    socket.off("data", onData);
    socket.pause();
    const rest = head.subarray(nl + 1);
    let upstream: Duplex;
    try {
      upstream = open(head.subarray(0, nl).toString("utf8"));
    } catch {
      return void socket.destroy();
    }
    if (rest.length) socket.unshift(rest);
    upstream.on("error", () => socket.destroy());
    socket.on("error", () => upstream.destroy());
    socket.once("close", () => upstream.destroy());
    // After an orderly end the socket ends by the pipe (its last bytes flushed); otherwise it is cut.
    upstream.once("close", () => {
      if (!upstream.readableEnded) socket.destroy();
    });
    socket.pipe(upstream);
    upstream.pipe(socket);
  };
  socket.on("data", onData);
}
