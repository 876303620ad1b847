import { createHash, timingSafeEqual } from "node:crypto";
import { connect, createServer, type Server, type Socket } from "node:net";
import { encodeTunnelReply, parseTunnelRequest, readTunnelLine, type TunnelRefusal } from "@sandbar/protocol/tunnel";

/** How long a caller may take to send its header line. */
const HEADER_TIMEOUT_MS = 5000;

const digest = (s: string) => createHash("sha256").update(s).digest();

/**
 * The byte tunnel to the sandbox's loopback (see @sandbar/protocol/tunnel): each connection
 * opens with a header naming the agent's secret and a port; the agent connects to that port on
 * 127.0.0.1 (then ::1) inside the sandbox and pipes both ways. pipe() gives back-pressure (a slow
 * reader pauses the other side); both sockets allow half-open, so an end from one side is passed
 * on as an end (FIN) while the other direction keeps flowing; an error on either destroys both.
 */
export function createTunnelServer(secret: string, log: (message: string, err?: unknown) => void): { server: Server; destroyAll(): void } {
  const expected = digest(secret);
  const open = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true, noDelay: true }, (client) => {
    open.add(client);
    client.once("close", () => open.delete(client));
    client.on("error", () => client.destroy());
    client.setTimeout(HEADER_TIMEOUT_MS, () => client.destroy());
    readHeader(client).then(
      (header) => {
        client.setTimeout(0);
        if (header === undefined) return;
        const request = parseTunnelRequest(header.line);
        if (!request) return refuse(client, "bad-request", "malformed tunnel header");
        if (!timingSafeEqual(digest(request.secret), expected)) return refuse(client, "auth", "wrong secret");
        dial(request.port).then(
          (target) => splice(client, target, header.rest),
          (err: NodeJS.ErrnoException) => {
            const reason: TunnelRefusal = err.code === "ECONNREFUSED" ? "refused" : "unreachable";
            refuse(client, reason, reason === "refused" ? `nothing listens on port ${request.port}` : `port ${request.port}: ${err.code ?? err.message}`);
          },
        );
      },
      (err: unknown) => {
        log("tunnel header", err);
        client.destroy();
      },
    );
  });
  return {
    server,
    destroyAll: () => {
      for (const s of open) s.destroy();
    },
  };
}

function refuse(client: Socket, reason: TunnelRefusal, message: string): void {
  client.end(encodeTunnelReply({ reason, message }));
}

/** The header line and whatever came after it; undefined (the connection answered or closed) if the caller left or sent too much. */
async function readHeader(client: Socket): Promise<{ line: string; rest: Buffer } | undefined> {
  const got = await readTunnelLine(client);
  if (got === "too-long") refuse(client, "bad-request", "tunnel header too long");
  else if (got === "ended") client.destroy();
  else return got;
  return undefined;
}

/** A connection to the port on the sandbox's loopback: IPv4 first, then IPv6 (servers bound to `localhost` may be either). */
async function dial(port: number): Promise<Socket> {
  try {
    return await connectTo("127.0.0.1", port);
  } catch (err) {
    try {
      return await connectTo("::1", port);
    } catch {
      throw err;
    }
  }
}

function connectTo(host: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ host, port, allowHalfOpen: true, noDelay: true });
    s.once("connect", () => {
      s.off("error", reject);
      resolve(s);
    });
    s.once("error", reject);
  });
}

function splice(client: Socket, target: Socket, early: Buffer): void {
  const kill = () => {
    client.destroy();
    target.destroy();
  };
  client.on("error", kill);
  target.on("error", kill);
  // The caller's side closes once both directions are done (all the target sent was written):
  // then nothing is left to deliver. The target closing first may leave writes to the caller queued.
  client.once("close", () => target.destroy());
  // Bytes the caller sent right behind its header belong to the target.
  if (early.length) target.write(early);
  client.write(encodeTunnelReply());
  client.pipe(target);
  target.pipe(client);
  client.resume();
}
