import { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { encodeTunnelRequest, parseTunnelReply, readTunnelLine, type TunnelRefusal } from "@sandbar/protocol/tunnel";

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
 * A connection to `port` on a sandbox's loopback, through its agent's tunnel (a unix socket
 * here, a stream through a runner): resolves once the agent says it is connected, with the
 * stream positioned at the first byte of the target's stream (anything the target already sent
 * is put back).
 */
export function dialTunnel(agent: { secret: string; tunnel(): Duplex }, port: number): Promise<Duplex> {
  const { secret } = agent;
  return new Promise((resolve, reject) => {
    const s = agent.tunnel();
    let settled = false;
    const settle = () => {
      settled = true;
      clearTimeout(timer);
      s.off("error", onError);
    };
    const fail = (err: TunnelError) => {
      if (settled) return;
      settle();
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
    s.on("error", onError);
    if (s instanceof Socket) s.once("connect", () => s.setNoDelay(true));
    // Written at once: a socket buffers it until it connects.
    s.write(encodeTunnelRequest({ port, secret }));
    void readTunnelLine(s).then((got) => {
      if (got === "ended") return fail(new TunnelError("protocol", "the sandbox's agent closed the tunnel"));
      if (got === "too-long") return fail(new TunnelError("protocol", "the tunnel's answer is too long"));
      const refusal = parseTunnelReply(got.line);
      if (refusal) return fail(new TunnelError(refusal.reason, refusal.message));
      if (settled) return;
      settle();
      // Anything the target already sent is put back, before the caller reads.
      if (got.rest.length) s.unshift(got.rest);
      resolve(s);
    });
  });
}
