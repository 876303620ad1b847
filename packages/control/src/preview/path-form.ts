import { createHash } from "node:crypto";
import type { PreviewAddress } from "./address.ts";

// The path form serves a sandbox's app on the API's own origin, which the app must not get the
// run of: its pages are sandboxed into an opaque origin (so their scripts cannot read the API or
// other previews with the visitor's cookies), and its cookies live in a jar of their own, scoped
// by the browser to the preview's path and by the proxy to the preview's name tag. The host form
// gives each preview its own origin and needs none of this.

/**
 * The Content-Security-Policy of every path-form answer: scripts, forms, popups, modals and
 * downloads work; without allow-same-origin the page's origin is opaque, so it can neither read
 * the API's origin nor other previews, nor its own cookies or storage.
 */
export const PATH_FORM_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/** One preview's cookies on the path form. */
export interface CookieJar {
  /** Put before every cookie name the app sets; only cookies bearing it go back to the app. */
  tag: string;
  /** The address's prefix (`/api/preview-proxy/{id}/{port}`), as the browser sent it. */
  prefix: string;
}

/**
 * A path-form address's jar. The tag names the sandbox (or signed token) and port: the browser's
 * Path scoping keeps other previews' cookies away, the tag also keeps away what a Path cannot
 * (cookies set for `/` or `/api` by anything on this origin, the proxy's own cookie).
 */
export function cookieJar(address: Pick<PreviewAddress, "id" | "port" | "prefix">): CookieJar {
  const digest = createHash("sha256").update(`${address.id}\n${address.port}`).digest("hex").slice(0, 16);
  return { tag: `sbx-${digest}-`, prefix: address.prefix };
}

/**
 * A Set-Cookie of the app as the browser gets it: the name tagged, no Domain (a host-only cookie),
 * and the Path moved under the preview's prefix (the app's own Path, or the default path RFC 6265
 * 5.1.4 derives from the app's request path, which would otherwise be the prefix's parent).
 */
export function scopeSetCookie(line: string, jar: CookieJar, appPath: string): string {
  const parts = line.split(";");
  const pair = parts[0]!.trim();
  const eq = pair.indexOf("=");
  // A cookie without "=" is a value with an empty name (RFC 6265bis 5.6).
  const named = eq < 0 ? `${jar.tag}=${pair}` : `${jar.tag}${pair.slice(0, eq).trim()}=${pair.slice(eq + 1).trim()}`;
  let path: string | undefined;
  const kept: string[] = [];
  for (const raw of parts.slice(1)) {
    const attr = raw.trim();
    if (!attr) continue;
    const aeq = attr.indexOf("=");
    const name = (aeq < 0 ? attr : attr.slice(0, aeq)).trim().toLowerCase();
    if (name === "domain") continue;
    if (name === "path") {
      path = aeq < 0 ? "" : attr.slice(aeq + 1).trim();
      continue;
    }
    kept.push(attr);
  }
  if (!path || !path.startsWith("/")) path = defaultPath(appPath);
  return [named, ...kept, `Path=${jar.prefix}${path}`].join("; ");
}

/** RFC 6265 5.1.4: the directory of the request path. */
function defaultPath(appPath: string): string {
  const q = appPath.search(/[?#]/);
  const path = q < 0 ? appPath : appPath.slice(0, q);
  const slash = path.lastIndexOf("/");
  return !path.startsWith("/") || slash === 0 ? "/" : path.slice(0, slash);
}

/** The Cookie header as the app gets it: its own cookies (tagged), untagged; nothing else. */
export function jarCookies(header: string, jar: CookieJar): string | undefined {
  const kept: string[] = [];
  for (const raw of header.split(";")) {
    const part = raw.trim();
    if (!part.startsWith(jar.tag)) continue;
    const rest = part.slice(jar.tag.length);
    // `tag=value` is the app's name-less cookie.
    kept.push(rest.startsWith("=") ? rest.slice(1) : rest);
  }
  return kept.length ? kept.join("; ") : undefined;
}

/** The most a response head may take before the proxy gives up on it (as node's own parser). */
const MAX_HEAD = 16 * 1024;

/**
 * The head of an upgrade's answer (the raw bytes the app wrote, up to the blank line), rewritten
 * for the path form: Set-Cookie scoped, the CSP added. Undefined while the head is incomplete;
 * throws if it grows past MAX_HEAD.
 */
export function splitHead(buffered: Buffer): { head: string; rest: Buffer } | undefined {
  const end = buffered.indexOf("\r\n\r\n");
  if (end < 0) {
    if (buffered.length > MAX_HEAD) throw new Error("the answer's head is too large");
    return undefined;
  }
  return { head: buffered.subarray(0, end).toString("latin1"), rest: buffered.subarray(end + 4) };
}

export function rewriteHead(head: string, jar: CookieJar, appPath: string): string {
  const lines = head.split("\r\n").map((line) => {
    const m = /^set-cookie[ \t]*:[ \t]*/i.exec(line);
    return m ? `Set-Cookie: ${scopeSetCookie(line.slice(m[0].length), jar, appPath)}` : line;
  });
  return [...lines, `Content-Security-Policy: ${PATH_FORM_CSP}`].join("\r\n") + "\r\n\r\n";
}
