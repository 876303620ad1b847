import { BlockList, isIP } from "node:net";
import { createContextKey } from "@connectrpc/connect";

/** The caller's IP address, on every call's context (REST and RPC alike): rate limits and audit read it. */
export const clientAddressKey = createContextKey<string>("");

/**
 * Proxies whose `X-Forwarded-For` is believed (SANDBAR_TRUSTED_PROXIES: addresses or CIDRs). One
 * list per process, set at start: without it the peer address is the caller, so a client cannot
 * pick its own rate-limit key by sending the header.
 */
let trusted = new BlockList();

export function trustProxies(entries: readonly string[]): void {
  const list = new BlockList();
  for (const entry of entries) {
    const [address, bits] = entry.split("/");
    const family = isIP(address ?? "") === 6 ? "ipv6" : "ipv4";
    if (bits === undefined) list.addAddress(address!, family);
    else list.addSubnet(address!, Number(bits), family);
  }
  trusted = list;
}

/** Parses SANDBAR_TRUSTED_PROXIES; throws on an entry that is not an address or CIDR. */
export function parseTrustedProxies(raw: string | undefined): string[] {
  const entries = (raw ?? "").split(",").map((s) => s.trim()).filter(Boolean);
  for (const entry of entries) {
    const [address, bits, extra] = entry.split("/");
    const family = isIP(address ?? "");
    const max = family === 6 ? 128 : 32;
    if (!family || extra !== undefined || (bits !== undefined && !(/^\d+$/.test(bits) && Number(bits) <= max))) {
      throw new Error(`SANDBAR_TRUSTED_PROXIES: "${entry}" is not an IP address or CIDR`);
    }
  }
  return entries;
}

const plain = (address: string) => (address.startsWith("::ffff:") && isIP(address.slice(7)) === 4 ? address.slice(7) : address);
const isTrusted = (address: string) => isIP(address) !== 0 && trusted.check(address, isIP(address) === 6 ? "ipv6" : "ipv4");

/**
 * The client's address: the socket's peer, or, behind trusted proxies, the right-most address
 * of `X-Forwarded-For` that is not itself a trusted proxy.
 */
export function clientAddress(req: { socket?: { remoteAddress?: string }; headers: Record<string, string | string[] | undefined> }): string {
  let address = plain(req.socket?.remoteAddress ?? "");
  if (!isTrusted(address)) return address;
  const header = req.headers["x-forwarded-for"];
  const hops = (Array.isArray(header) ? header.join(",") : (header ?? "")).split(",").map((s) => plain(s.trim())).filter((s) => isIP(s));
  while (hops.length && isTrusted(address)) address = hops.pop()!;
  return address;
}
