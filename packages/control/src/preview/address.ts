import { errors } from "@sandbar/protocol";

// Where a preview request goes: `{port}-{sandboxId}.{preview domain}` by Host header, or the path
// form `/api/preview-proxy/{sandboxId}/{port}/...` for hosts without wildcard DNS. The id may be
// a signed preview URL's token instead of a sandbox id. Only the path after the prefix is the
// request's to choose: the sandbox and port come from the address, and the connection to the port
// is made by the sandbox's agent on its loopback.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** Signed preview URL tokens: 16 lower-case letters and digits. */
export const SIGNED_TOKEN = /^[a-z0-9]{16}$/;
export const PATH_PREFIX = "/preview-proxy";

export interface PreviewAddress {
  /** A sandbox id, or a signed URL's token. */
  id: string;
  signed: boolean;
  port: number;
  /** The path and query the sandbox's server gets (starts with `/`). */
  path: string;
  /** What the address takes off the front of the path: empty for the host form. */
  prefix: string;
}

/** The first label of a Host header under the preview domain, or undefined for any other host. */
export function hostLabel(host: string | undefined, domain: string): string | undefined {
  if (!host) return undefined;
  const name = host.toLowerCase().replace(/:[0-9]*$/, "").replace(/\.$/, "");
  const suffix = "." + domain;
  if (!name.endsWith(suffix)) return undefined;
  const label = name.slice(0, -suffix.length);
  return label && !label.includes(".") ? label : undefined;
}

/** The address of a host-form request (its label, from hostLabel, and its request target). */
export function hostAddress(label: string, url: string): PreviewAddress {
  const dash = label.indexOf("-");
  if (dash < 0) throw errors.notFound(`Not a preview host: expected {port}-{sandboxId}, got ${label}`);
  return { ...idAndPort(label.slice(dash + 1), label.slice(0, dash)), path: originForm(url), prefix: "" };
}

/**
 * The address of a path-form request. `url` is the raw request target, `/api/preview-proxy/...`
 * (kept raw: the sandbox's server decodes its own path).
 */
export function pathAddress(url: string, base: string): PreviewAddress {
  const target = originForm(url);
  const q = target.indexOf("?");
  const pathname = q < 0 ? target : target.slice(0, q);
  const head = base + PATH_PREFIX + "/";
  if (!pathname.startsWith(head)) throw errors.notFound(`Cannot reach ${pathname}`);
  const parts = pathname.slice(head.length).split("/");
  const [rawId = "", rawPort = ""] = parts;
  const prefix = `${base}${PATH_PREFIX}/${rawId}/${rawPort}`;
  const rest = target.slice(prefix.length);
  return { ...idAndPort(decoded(rawId), rawPort), path: rest.startsWith("/") ? rest : "/" + rest, prefix };
}

function decoded(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw errors.invalidArgument("Malformed URL encoding in path");
  }
}

function idAndPort(id: string, rawPort: string): { id: string; signed: boolean; port: number } {
  const port = Number(rawPort);
  if (!/^[0-9]{1,5}$/.test(rawPort) || port < 1 || port > 65535) throw errors.invalidArgument("Invalid port");
  const lower = id.toLowerCase();
  if (UUID.test(lower)) return { id: lower, signed: false, port };
  if (SIGNED_TOKEN.test(id)) return { id, signed: true, port };
  throw errors.notFound(`Sandbox with ID ${id.slice(0, 64)} not found`);
}

/** The request target as a path: an absolute-form or authority-form target could name another host, and is refused. */
function originForm(url: string): string {
  if (!url.startsWith("/")) throw errors.invalidArgument("The request target must be a path (origin form)");
  return url;
}
