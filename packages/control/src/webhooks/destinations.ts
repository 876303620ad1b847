import { lookup, type LookupAddress } from "node:dns";
import type { RequestOptions } from "node:http";
import { BlockList, isIP } from "node:net";
import { networkInterfaces } from "node:os";

// Where webhooks may go. A webhook makes the server send requests to an address a customer
// chose, so addresses inside the operator's network are refused (loopback, private, link-local,
// unique-local, unspecified, cloud metadata...), and so is every address of this host's own
// interfaces (a public address on eth0 reaches the server's own ports as loopback would), unless
// SANDBAR_WEBHOOK_ALLOW_PRIVATE is set. IPv6 forms that carry an IPv4 address (mapped,
// compatible, translated) are judged by that IPv4 address. The check runs on create and update
// (the URL as given) and again on every delivery, against the address actually connected to (a
// name may resolve elsewhere later: DNS rebinding).

const internal = new BlockList();
for (const [net, bits] of [
  ["0.0.0.0", 8], // "this network", unspecified
  ["10.0.0.0", 8],
  ["100.64.0.0", 10], // carrier-grade NAT (also Alibaba's metadata address)
  ["127.0.0.0", 8],
  ["169.254.0.0", 16], // link-local, cloud metadata (169.254.169.254)
  ["172.16.0.0", 12],
  ["192.0.0.0", 24],
  ["192.168.0.0", 16],
  ["198.18.0.0", 15],
  ["224.0.0.0", 4], // multicast
  ["240.0.0.0", 4], // reserved, broadcast
] as const) internal.addSubnet(net, bits, "ipv4");
for (const [net, bits] of [
  ["::", 128], // unspecified
  ["::1", 128],
  // Prefixes that embed an IPv4 address a gateway then reaches: refused whole, whatever the
  // embedded address (one inside the network is what they would smuggle through).
  ["64:ff9b::", 96], // NAT64 (well-known prefix)
  ["64:ff9b:1::", 48], // NAT64 (local-use prefix)
  ["2002::", 16], // 6to4
  ["fc00::", 7], // unique local (also AWS's metadata address fd00:ec2::254)
  ["fe80::", 10], // link-local
  ["ff00::", 8], // multicast
] as const) internal.addSubnet(net, bits, "ipv6");

/**
 * The IPv4 address an IPv6 address stands for, in the forms that reach that IPv4 host: mapped
 * (::ffff:a.b.c.d), compatible (::a.b.c.d, deprecated) and translated (::ffff:0:a.b.c.d).
 * `address` is one isIP() accepted.
 */
export function embeddedIPv4(address: string): string | undefined {
  const w = ipv6Words(address);
  if (w[0] || w[1] || w[2] || w[3]) return undefined;
  const [w4, w5, w6, w7] = [w[4]!, w[5]!, w[6]!, w[7]!];
  const mappedOrCompatible = w4 === 0 && (w5 === 0 || w5 === 0xffff);
  const translated = w4 === 0xffff && w5 === 0;
  if (!mappedOrCompatible && !translated) return undefined;
  if (w4 === 0 && w5 === 0 && w6 === 0 && w7 <= 1) return undefined; // :: and ::1 are themselves
  return `${w6 >> 8}.${w6 & 255}.${w7 >> 8}.${w7 & 255}`;
}

/** The eight 16-bit words of an IPv6 address that isIP() accepted (a zone, %eth0, dropped). */
function ipv6Words(address: string): number[] {
  let s = address.replace(/%.*$/, "");
  const dotted = /(?:^|:)(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (dotted) {
    const [a, b, c, d] = dotted[1]!.split(".").map(Number) as [number, number, number, number];
    s = s.slice(0, s.length - dotted[1]!.length) + ((a << 8) | b).toString(16) + ":" + ((c << 8) | d).toString(16);
  }
  const words = (part: string) => (part ? part.split(":").map((x) => parseInt(x, 16)) : []);
  const [left, right] = s.split("::") as [string, string | undefined];
  const l = words(left);
  if (right === undefined) return l;
  const r = words(right);
  return [...l, ...new Array<number>(8 - l.length - r.length).fill(0), ...r];
}

/**
 * This host's interface addresses (all interfaces: loopback, eth0, sandboxes' veths and bridges),
 * re-read when a second old so that an address added since is soon known.
 */
const OWN_TTL_MS = 1000;
let own: { list: BlockList; at: number } | undefined;
function ownAddresses(): BlockList {
  const now = Date.now();
  if (own && now - own.at < OWN_TTL_MS) return own.list;
  const list = new BlockList();
  for (const info of Object.values(networkInterfaces()).flat()) {
    if (!info) continue;
    const address = info.address.replace(/%.*$/, "");
    if (isIP(address)) list.addAddress(address, info.family === "IPv4" ? "ipv4" : "ipv6");
  }
  own = { list, at: now };
  return list;
}

/** Is this IP address inside the operator's network (or otherwise no place for a webhook)? Ranges only, not this host's own addresses. */
export function isInternalAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 0) return true;
  const v4 = family === 6 ? embeddedIPv4(address) : undefined;
  if (v4) return isInternalAddress(v4);
  return internal.check(address.replace(/%.*$/, ""), family === 4 ? "ipv4" : "ipv6");
}

/**
 * Why a webhook may not go to this IP address ("an internal address", "an address of this
 * server"), or undefined. The one check of create, update and delivery.
 */
function refusedAddress(address: string): string | undefined {
  if (isInternalAddress(address)) return "an internal address";
  const family = isIP(address);
  const v4 = family === 6 ? embeddedIPv4(address) : undefined;
  const plain = v4 ?? address.replace(/%.*$/, "");
  if (ownAddresses().check(plain, isIP(plain) === 4 ? "ipv4" : "ipv6")) return "an address of this server";
  return undefined;
}

/** The address as a message names it: an IPv6 form that carries an IPv4 address names both. */
const named = (address: string) => {
  const v4 = isIP(address) === 6 ? embeddedIPv4(address) : undefined;
  return v4 ? `${address}, IPv4 ${v4}` : address;
};

class DestinationError extends Error {}

const ALLOW_HINT = "set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true to allow internal destinations";
const MAX_URL_LENGTH = 2048;

/** The URL's host as an address or name: brackets off IPv6 literals. */
const hostOf = (url: URL) => url.hostname.replace(/^\[(.*)\]$/, "$1");

/** Problems of the URL itself, before any name resolution: a message naming the field, or undefined. */
export function urlProblem(raw: string, allowPrivate: boolean): string | undefined {
  if (raw.length > MAX_URL_LENGTH) return `url must be shorter than or equal to ${MAX_URL_LENGTH} characters`;
  if (!URL.canParse(raw)) return "url must be a valid URL";
  const url = new URL(raw);
  if (url.protocol !== "http:" && url.protocol !== "https:") return "url must use http or https";
  if (url.username || url.password) return "url must not contain a user name or password";
  const host = hostOf(url);
  if (!host) return "url must name a host";
  if (allowPrivate) return undefined;
  if (isIP(host)) {
    const why = refusedAddress(host);
    return why ? `url must not point at ${why} (${named(host)}); ${ALLOW_HINT}` : undefined;
  }
  if (/(^|\.)localhost\.?$/i.test(host)) return `url must not point at an internal address (${host}); ${ALLOW_HINT}`;
  return undefined;
}

/**
 * Checks a URL on create or update: its form, then every address its name resolves to now. A
 * name that does not resolve yet is accepted (delivery checks again); one that resolves inside
 * the network or to this host is refused.
 */
export async function checkDestination(raw: string, allowPrivate: boolean): Promise<string | undefined> {
  const problem = urlProblem(raw, allowPrivate);
  if (problem || allowPrivate) return problem;
  const host = hostOf(new URL(raw));
  if (isIP(host)) return undefined;
  const addresses = await resolveAll(host, 3000).catch(() => [] as LookupAddress[]);
  for (const { address } of addresses) {
    const why = refusedAddress(address);
    if (why) return `url host ${host} resolves to ${why} (${named(address)}); ${ALLOW_HINT}`;
  }
  return undefined;
}

function resolveAll(host: string, timeoutMs: number): Promise<LookupAddress[]> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("lookup timed out")), timeoutMs);
    lookup(host, { all: true }, (err, addresses) => {
      clearTimeout(timer);
      if (err) reject(err);
      else resolve(addresses);
    });
  });
}

/**
 * Delivery's check of where it is about to connect: a literal address in the URL (`host` itself,
 * which http.request connects to without a lookup) or the addresses a name resolved to. Why not,
 * or undefined.
 */
export function connectRefusal(host: string, addresses: readonly string[], allowPrivate: boolean): string | undefined {
  if (allowPrivate) return undefined;
  for (const address of addresses) {
    const why = refusedAddress(address);
    if (!why) continue;
    return address === host ? `destination ${named(host)} is ${why}` : `destination ${host} resolves to ${why} (${named(address)})`;
  }
  return undefined;
}

/**
 * A `lookup` for http.request that refuses what connectRefusal refuses: the socket connects only
 * to an address this function answered, so what is checked is what is used.
 */
export function guardedLookup(allowPrivate: boolean): NonNullable<RequestOptions["lookup"]> {
  return (hostname, options, callback) => {
    lookup(hostname, { all: true }, (err, addresses) => {
      if (err) return callback(err, []);
      const why = connectRefusal(hostname, addresses.map((a) => a.address), allowPrivate);
      if (why) return callback(new DestinationError(why), []);
      if (!addresses.length) return callback(new DestinationError(`destination ${hostname} has no address`), []);
      if (options.all) return callback(null, addresses);
      callback(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}
