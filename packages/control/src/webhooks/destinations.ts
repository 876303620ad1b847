import { lookup, type LookupAddress } from "node:dns";
import type { RequestOptions } from "node:http";
import { BlockList, isIP } from "node:net";

// Where webhooks may go. A webhook makes the server send requests to an address a customer
// chose, so addresses inside the operator's network are refused (loopback, private, link-local,
// unique-local, unspecified, cloud metadata...) unless SANDBAR_WEBHOOK_ALLOW_PRIVATE is set. The
// check runs on create and update (the URL as given) and again on every delivery, against the
// address actually connected to (a name may resolve elsewhere later: DNS rebinding).

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
  ["64:ff9b::", 96], // NAT64: likewise
  ["2002::", 16], // 6to4: likewise
  ["fc00::", 7], // unique local (also AWS's metadata address fd00:ec2::254)
  ["fe80::", 10], // link-local
  ["ff00::", 8], // multicast
] as const) internal.addSubnet(net, bits, "ipv6");
// IPv4-mapped IPv6 addresses (::ffff:127.0.0.1) need no rule: BlockList checks them against the IPv4 rules.

/** Is this IP address inside the operator's network (or otherwise no place for a webhook)? */
export function isInternalAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 0) return true;
  return internal.check(address, family === 4 ? "ipv4" : "ipv6");
}

export class DestinationError extends Error {}

const ALLOW_HINT = "set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true to allow internal destinations";
export const MAX_URL_LENGTH = 2048;

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
  if (isIP(host)) return isInternalAddress(host) ? `url must not point at an internal address (${host}); ${ALLOW_HINT}` : undefined;
  if (/(^|\.)localhost\.?$/i.test(host)) return `url must not point at an internal address (${host}); ${ALLOW_HINT}`;
  return undefined;
}

/**
 * Checks a URL on create or update: its form, then every address its name resolves to now. A
 * name that does not resolve yet is accepted (delivery checks again); one that resolves inside
 * the network is refused.
 */
export async function checkDestination(raw: string, allowPrivate: boolean): Promise<string | undefined> {
  const problem = urlProblem(raw, allowPrivate);
  if (problem || allowPrivate) return problem;
  const host = hostOf(new URL(raw));
  if (isIP(host)) return undefined;
  const addresses = await resolveAll(host, 3000).catch(() => [] as LookupAddress[]);
  const bad = addresses.find((a) => isInternalAddress(a.address));
  return bad ? `url host ${host} resolves to an internal address (${bad.address}); ${ALLOW_HINT}` : undefined;
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
 * A `lookup` for http.request that refuses internal addresses: the socket connects only to an
 * address this function answered, so what is checked is what is used.
 */
export function guardedLookup(allowPrivate: boolean): NonNullable<RequestOptions["lookup"]> {
  return (hostname, options, callback) => {
    lookup(hostname, { all: true }, (err, addresses) => {
      if (err) return callback(err, []);
      const bad = allowPrivate ? undefined : addresses.find((a) => isInternalAddress(a.address));
      if (bad) return callback(new DestinationError(`destination ${hostname} resolves to an internal address (${bad.address})`), []);
      if (!addresses.length) return callback(new DestinationError(`destination ${hostname} has no address`), []);
      if (options.all) return callback(null, addresses);
      callback(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}
