import { BlockList, isIP } from "node:net";

/**
 * Proxies whose `X-Forwarded-For` is believed (SANDBAR_TRUSTED_PROXIES: addresses or CIDRs). One
 * list per process, set at start: without it the peer address is the caller, so a client cannot
 * pick its own rate-limit key by sending the header.
 */
let trusted = new BlockList();

export function trustProxies(entries: readonly string[]): void {
  trusted = addressList(entries);
}

/** A BlockList of addresses and CIDRs (entries checked by parseAddressList). */
export function addressList(entries: readonly string[]): BlockList {
  const list = new BlockList();
  for (const entry of entries) {
    const [address, bits] = entry.split("/");
    const family = isIP(address ?? "") === 6 ? "ipv6" : "ipv4";
    if (bits === undefined) list.addAddress(address!, family);
    else list.addSubnet(address!, Number(bits), family);
  }
  return list;
}

/** Parses a comma-separated list of addresses and CIDRs; throws, naming `variable`, on an entry that is neither. */
export function parseAddressList(variable: string, raw: string | undefined): string[] {
  const entries = (raw ?? "").split(",").map((s) => s.trim()).filter(Boolean);
  for (const entry of entries) {
    const [address, bits, extra] = entry.split("/");
    const family = isIP(address ?? "");
    const max = family === 6 ? 128 : 32;
    if (!family || extra !== undefined || (bits !== undefined && !(/^\d+$/.test(bits) && Number(bits) <= max))) {
      throw new Error(`${variable}: "${entry}" is not an IP address or CIDR`);
    }
  }
  return entries;
}

/** Parses SANDBAR_TRUSTED_PROXIES; throws on an entry that is not an address or CIDR. */
export const parseTrustedProxies = (raw: string | undefined): string[] => parseAddressList("SANDBAR_TRUSTED_PROXIES", raw);

/** An IPv4 address as itself, not in its IPv4-mapped IPv6 form (::ffff:a.b.c.d). */
export const plainAddress = (address: string) => (address.startsWith("::ffff:") && isIP(address.slice(7)) === 4 ? address.slice(7) : address);
const plain = plainAddress;

/** Where a connection's client address, as a load balancer's PROXY header stated it, is kept. */
const DECLARED = Symbol("sandbar.proxyProtocolClient");
type PeerSocket = { remoteAddress?: string; [DECLARED]?: string };

/** Records the client address a trusted load balancer stated for this connection (server/proxy-accept.ts). */
export function declareClient(socket: object, address: string): void {
  (socket as PeerSocket)[DECLARED] = address;
}

/**
 * The connection's peer: the address a PROXY header stated, else the socket's own. Reads through
 * an HTTP/2 request's socket too (Node's proxy of it forwards property reads to the session's socket).
 */
export function peerAddress(socket: PeerSocket | undefined): string {
  return plain(socket?.[DECLARED] ?? socket?.remoteAddress ?? "");
}
const isTrusted = (address: string) => isIP(address) !== 0 && trusted.check(address, isIP(address) === 6 ? "ipv6" : "ipv4");

/**
 * The client's address, the one function every reader of it calls (rate limits, audit, sign-in
 * throttle, preview forwarding): the connection's peer (as a PROXY header stated it, see
 * peerAddress), or, behind trusted proxies, the right-most address
 * of `X-Forwarded-For` that is not itself a trusted proxy.
 */
export function clientAddress(req: { socket?: PeerSocket; headers: Record<string, string | string[] | undefined> }): string {
  let address = peerAddress(req.socket);
  if (!isTrusted(address)) return address;
  const header = req.headers["x-forwarded-for"];
  const hops = (Array.isArray(header) ? header.join(",") : (header ?? "")).split(",").map((s) => plain(s.trim())).filter((s) => isIP(s));
  while (hops.length && isTrusted(address)) address = hops.pop()!;
  return address;
}
