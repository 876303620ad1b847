import { errors } from "@sandbar/protocol";
import type { RuntimeNetwork } from "./runtime.ts";

// A sandbox's network policy as the API speaks it (networkBlockAll, networkAllowList: comma-
// separated IPv4 CIDRs, at most 10) checked with the reference's messages, and what the host
// enforces for it (linux/network.ts in the runner). Domain allow lists are validated as the
// reference does, then refused: nothing here can enforce a domain (the reference's runner does
// not either), and accepting one silently would promise a restriction that does not exist.

const MAX_ALLOW_LIST = 10;

/** The operator's default for creates that say nothing (SANDBAR_SANDBOX_NETWORK). */
export type DefaultNetwork = "none" | "egress";

export interface NetworkFields {
  networkBlockAll: boolean;
  /** Normalized (trimmed entries, joined with ","); null when empty. */
  networkAllowList?: string | null;
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

/** The CIDRs of a comma-separated list (empty entries skipped), or a 400 naming the bad entry. */
export function parseNetworkAllowList(list: string): string[] {
  const entries = list.split(",").map((s) => s.trim());
  const networks: string[] = [];
  for (const network of entries) {
    if (!network) continue;
    const slash = network.indexOf("/");
    const address = slash < 0 ? network : network.slice(0, slash);
    const prefix = slash < 0 ? "" : network.slice(slash + 1);
    if (!IPV4.test(address)) throw errors.invalidArgument(`Invalid IP address: "${address}" in network "${network}". Must be a valid IPv4 address`);
    if (!prefix) throw errors.invalidArgument(`Invalid network format: "${network}". Missing CIDR prefix length (e.g., /24)`);
    if (!/^\d{1,2}$/.test(prefix) || Number(prefix) > 32) throw errors.invalidArgument(`Invalid CIDR prefix length: ${network}. Prefix must be between 0 and 32`);
    networks.push(network);
  }
  if (entries.length > MAX_ALLOW_LIST) throw errors.invalidArgument(`Network allow list cannot contain more than ${MAX_ALLOW_LIST} networks`);
  return networks;
}

const DOMAIN = /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$/i;

/** Checks a domain allow list as the reference does, then refuses it (see above). */
export function refuseDomainAllowList(list: string | undefined): void {
  if (list === undefined || list.trim() === "") return;
  const domains = list.split(",").map((s) => s.trim());
  for (const d of domains) if (d && !DOMAIN.test(d)) throw errors.invalidArgument(`Invalid domain: "${d}". Must be a valid domain name`);
  if (domains.length > MAX_ALLOW_LIST) throw errors.invalidArgument(`Domain allow list cannot contain more than ${MAX_ALLOW_LIST} domains`);
  throw errors.invalidArgument("domainAllowList is not supported by this server (domains cannot be enforced here): use networkAllowList with IPv4 CIDRs");
}

/**
 * The policy of a new sandbox: networkBlockAll=true wins (never more access than asked), then an
 * allow list, then networkBlockAll=false (anywhere), then the operator's default.
 */
export function createNetwork(blockAll: boolean | undefined, allowList: string | undefined, fallback: DefaultNetwork): NetworkFields {
  const cidrs = allowList === undefined ? [] : parseNetworkAllowList(allowList);
  if (blockAll === true) return { networkBlockAll: true, networkAllowList: null };
  if (cidrs.length > 0) return { networkBlockAll: false, networkAllowList: cidrs.join(",") };
  return { networkBlockAll: blockAll ?? fallback === "none", networkAllowList: null };
}

/**
 * The reference's update semantics: an empty string clears the list, networkBlockAll=true clears
 * it, a non-empty list forces networkBlockAll=false, networkBlockAll=false without a list clears it.
 */
export function updateNetwork(current: NetworkFields, blockAll: boolean | undefined, allowList: string | undefined): NetworkFields {
  const cidrs = allowList === undefined ? undefined : parseNetworkAllowList(allowList);
  if (cidrs !== undefined && cidrs.length > 0) return { networkBlockAll: false, networkAllowList: cidrs.join(",") };
  if (blockAll !== undefined) return { networkBlockAll: blockAll, networkAllowList: null };
  if (cidrs !== undefined) return { ...current, networkAllowList: null };
  return current;
}

/** What the host enforces for these fields. */
export function runtimeNetwork(f: NetworkFields): RuntimeNetwork {
  if (f.networkAllowList) return { mode: "allow-list", allowList: f.networkAllowList.split(",") };
  return f.networkBlockAll ? { mode: "none", allowList: [] } : { mode: "full", allowList: [] };
}
