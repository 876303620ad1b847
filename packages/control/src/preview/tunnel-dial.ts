import { connect, type Socket } from "node:net";
import { encodeTunnelRequest, parseTunnelReply, TUNNEL_MAX_HEADER, type TunnelRefusal } from "@sandbar/protocol/tunnel";

/** How long the agent may take to connect to the port and answer. */
const DIAL_TIMEOUT_MS = 10_000;

/** Why a tunnel could not be opened: the agent refused (its reason), or the agent is not there. */
export class TunnelError extends Error {
  readonly reason: TunnelRefusal | "protocol" | "agent";
  constructor(reason: TunnelError["reason"], message: string) {
    super(message);
    this.reason = reason;
  }
}

/**
 * A connection to `port` on a sandbox's loopback, through its agent's tunnel socket: resolves
 * once the agent says it is connected, with the socket positioned at the first byte of the
 * target's stream (anything the target already sent is put back).
 */
export function dialTunnel(tunnelSocket: string, secret: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ path: tunnelSocket, allowHalfOpen: true });
    let buffered: Buffer = Buffer.alloc(0);
    const fail = (err: TunnelError) => {
      cleanup();
      s.destroy();
      reject(err);
    };
    const timer = setTimeout(() => fail(new TunnelError("unreachable", `the sandbox did not connect to port ${port} within ${DIAL_TIMEOUT_MS} ms`)), DIAL_TIMEOUT_MS);
    const onError = (err: NodeJS.ErrnoException) =>
      fail(
        new TunnelError(
          "agent",
          err.code === "ENOENT"
            ? "its agent offers no tunnel (an agent started before the preview proxy existed: restart the sandbox)"
            : err.code === "ECONNREFUSED"
              ? "its agent is not listening"
              : `its agent: ${err.message}`,
        ),
      );
    const onEnd = () => fail(new TunnelError("protocol", "the sandbox's agent closed the tunnel"));
    const onData = (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      const nl = buffered.indexOf(10);
      if (nl < 0) {
        if (buffered.length > TUNNEL_MAX_HEADER) fail(new TunnelError("protocol", "the tunnel's answer is too long"));
        return;
      }
      const refusal = parseTunnelReply(buffered.subarray(0, nl).toString("latin1"));
      if (refusal) return fail(new TunnelError(refusal.reason, refusal.message));
      cleanup();
      s.pause();
      const rest = buffered.subarray(nl + 1);
      if (rest.length) s.unshift(rest);
      resolve(s);
    };
    const cleanup = () => {
      clearTimeout(timer);
      s.off("error", onError);
      s.off("data", onData);
      s.off("end", onEnd);
    };
    s.on("error", onError);
    s.on("data", onData);
    s.on("end", onEnd);
    s.once("connect", () => {
      s.setNoDelay(true);
      s.write(encodeTunnelRequest({ port, secret }));
    });
  });
}
