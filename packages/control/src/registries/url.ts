// Registry addresses: what a user may type as a registry's URL, the form it is stored in, and the
// host an image reference is matched against.

/** Docker Hub answers under several names; images name it "docker.io" once parsed. */
const DOCKER_HUB = "docker.io";
const DOCKER_HUB_ALIASES = new Set([DOCKER_HUB, "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"]);

const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const IPV4 = /^(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

export interface RegistryUrl {
  /** As stored and answered: the scheme if one was given, the host lower-cased, no trailing slash. */
  url: string;
  /** host[:port] as image references name it (default ports dropped, Docker Hub aliases folded). */
  host: string;
}

/**
 * A registry URL in either form users write: "registry.example.com[:port][/path]" or with an
 * http(s) scheme. Hosts are DNS names with a dot, IPv4/IPv6 literals or localhost; no user info,
 * query or fragment (credentials go in their own fields). Undefined when it is none of these.
 */
export function parseRegistryUrl(input: string): RegistryUrl | undefined {
  const raw = input.trim();
  if (raw === "" || raw.length > 2048 || /[\s\\]/.test(raw)) return undefined;
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(raw)?.[1]?.toLowerCase();
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") return undefined;
  let parsed: URL;
  try {
    parsed = new URL(scheme ? raw : `https://${raw}`);
  } catch {
    return undefined;
  }
  if (parsed.username || parsed.password || parsed.search || parsed.hash || raw.includes("?") || raw.includes("#")) return undefined;
  const hostname = parsed.hostname.toLowerCase();
  if (!validHostname(hostname)) return undefined;
  const path = parsed.pathname.replace(/\/+$/, "");
  const url = `${scheme ? `${scheme}://` : ""}${parsed.host.toLowerCase()}${path}`;
  // Percent-encoding can make the stored form longer than what was typed.
  if (url.length > 2048) return undefined;
  return { url, host: canonicalRegistryHost(parsed.host) };
}

/** The host of a stored registry URL, in the form image references use. */
export function hostOfRegistryUrl(url: string): string | undefined {
  return parseRegistryUrl(url)?.host;
}

/**
 * host[:port] lower-cased, Docker Hub's names folded into "docker.io". WHATWG URL parsing
 * already drops a default port, so "https://r.example.com:443" and "r.example.com" meet here.
 */
export function canonicalRegistryHost(host: string): string {
  const h = host.trim().toLowerCase().replace(/:443$/, "");
  return DOCKER_HUB_ALIASES.has(h) ? DOCKER_HUB : h;
}

function validHostname(hostname: string): boolean {
  if (hostname === "localhost") return true;
  if (hostname.startsWith("[") && hostname.endsWith("]")) return true; // WHATWG URL validated the IPv6 literal
  if (IPV4.test(hostname)) return true;
  const labels = hostname.split(".");
  // A DNS name needs a dot and a top-level label that is not all digits (as class-validator's IsUrl).
  return labels.length >= 2 && labels.every((l) => LABEL.test(l)) && !/^\d+$/.test(labels[labels.length - 1]!) && hostname.length <= 253;
}
