import type { BlockList, Socket } from "node:net";
import { declareClient, plainAddress } from "./client-address.ts";
import { parseProxyHeader, type ProxyHeader } from "./proxy-protocol.ts";

/** PROXY protocol on a listener: which peers must send the header, how long they have to. */
export interface ProxyProtocolOptions {
  /** Peers (load balancers) that must start each connection with a PROXY header; no other peer's is read. */
  from: BlockList;
  /** A peer that has not sent a whole header by then is dropped. */
  timeoutMs?: number;
  log?: (line: string) => void;
}

const PROXY_HEADER_TIMEOUT_MS = 10_000;

export type HeaderOutcome = { ok: true; header: ProxyHeader } | { ok: false; reason: string; received: number };

/**
 * Reads the PROXY header off the front of `socket`, byte chunks as they come, and leaves the socket
 * paused with whatever followed the header put back (the HTTP, HTTP/2 or TLS bytes that are
 * the connection's real start). Holds nothing past the header's own bound. (A TLS server fed this
 * socket must get it as a JS stream: Node's TLSSocket takes a net.Socket's handle and would not see
 * the bytes put back; the control listener serves no TLS.)
 */
export function readProxyHeader(socket: Socket, timeoutMs = PROXY_HEADER_TIMEOUT_MS): Promise<HeaderOutcome> {
  return new Promise((resolve) => {
    let buf: Buffer = Buffer.alloc(0);
    const finish = (outcome: HeaderOutcome) => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("close", onEnd);
      socket.off("error", onEnd);
      resolve(outcome);
    };
    const onData = (chunk: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      const parsed = parseProxyHeader(buf);
      if (parsed.state === "incomplete") return;
      socket.pause();
      if (parsed.state === "invalid") return finish({ ok: false, reason: parsed.reason, received: buf.length });
      if (buf.length > parsed.header.length) socket.unshift(buf.subarray(parsed.header.length));
      finish({ ok: true, header: parsed.header });
    };
    const onEnd = () => finish({ ok: false, reason: buf.length ? "closed in the middle of the PROXY header" : "closed before sending anything", received: buf.length });
    const timer = setTimeout(() => finish({ ok: false, reason: `no complete PROXY header within ${timeoutMs} ms`, received: buf.length }), timeoutMs);
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("close", onEnd);
    socket.once("error", onEnd);
  });
}

/**
 * Admits a connection: from a configured load balancer, after its PROXY header (whose client
 * address then stands for the socket's); from anyone else, as is (their bytes are never read as
 * a header, so a client cannot claim an address). Resolves false when the connection was dropped.
 */
export function proxyAdmission(options: ProxyProtocolOptions | undefined): (socket: Socket) => Promise<boolean> {
  if (!options) return async () => true;
  const { from, timeoutMs = PROXY_HEADER_TIMEOUT_MS, log = () => {} } = options;
  // One line per misbehaving peer, not per connection: a misconfigured balancer opens many.
  const logged = new Set<string>();
  return async (socket) => {
    const peer = plainAddress(socket.remoteAddress ?? "");
    if (!peer || !from.check(peer, peer.includes(":") ? "ipv6" : "ipv4")) return true;
    const outcome = await readProxyHeader(socket, timeoutMs);
    if (outcome.ok) {
      if (outcome.header.source) declareClient(socket, outcome.header.source.address);
      return true;
    }
    socket.destroy();
    // A balancer's connect-only health check closes without a byte: nothing to report.
    if (outcome.received > 0 || !outcome.reason.startsWith("closed")) {
      if (!logged.has(peer) && logged.size < 1000) {
        logged.add(peer);
        log(`PROXY protocol: dropped a connection from ${peer}: ${outcome.reason} (further ones from ${peer} are not logged)`);
      }
    }
    return false;
  };
}
