import type { IncomingMessage } from "node:http";
import { ConnectError, errors } from "@sandbar/protocol";
import { isAuthToken } from "../sandboxes/manager.ts";
import type { PreviewAddress } from "./address.ts";
import { cookieValue, COOKIE_MAX_AGE_S, type PreviewCookies } from "./cookie.ts";
import type { PreviewSandbox } from "./lookup.ts";

/** The preview token header, and the reference clients' spelling of it. */
export const PREVIEW_TOKEN_HEADERS = ["x-sandbar-preview-token", "x-daytona-preview-token"];
/** The query parameter a token link carries (browsers cannot send a header). */
export const PREVIEW_TOKEN_QUERY = "DAYTONA_SANDBOX_AUTH_KEY";
/** The agent's port in the reference: always needs a credential, public sandbox or not. */
const TOOLBOX_PORT = 2280;

/** How a request was let through, and what it leaves for the response. */
export interface Grant {
  how: "public" | "signed" | "bearer" | "token" | "query" | "cookie";
  /** The credential headers the sandbox's server must not see. */
  consumedAuthorization: boolean;
  /** A Set-Cookie for the response (after a token link). */
  setCookie?: string;
}

export interface AccessCheck {
  cookies: PreviewCookies;
  /** Checks an `Authorization: Bearer` API key or JWT: the caller must be a member of the sandbox's organization. */
  checkBearer(req: IncomingMessage, sandboxId: string): Promise<void>;
  /** Whether cookies the proxy sets are for https only. */
  secure: boolean;
}


/**
 * Who may reach a sandbox port (reference proxy rules): a public sandbox's ports, except the
 * toolbox port, need nothing; otherwise, in this order, a signed URL's token (the address
 * itself), `Authorization: Bearer` of a member of the sandbox's organization, the sandbox's
 * preview token in a header, the token as a query parameter (which leaves a cookie), or that
 * cookie. A wrong credential is 401 naming what was wrong; none at all is 401 saying what to send.
 */
export async function authorize(check: AccessCheck, req: IncomingMessage, query: URLSearchParams, address: PreviewAddress, sandbox: PreviewSandbox): Promise<Grant> {
  const grant = (how: Grant["how"], extra: Partial<Grant> = {}): Grant => ({ how, consumedAuthorization: false, ...extra });
  if (address.signed) return grant("signed");
  if (sandbox.public && address.port !== TOOLBOX_PORT) return grant("public");

  const failures: ConnectError[] = [];
  const authorization = req.headers.authorization;
  if (authorization && /^bearer\s/i.test(authorization)) {
    try {
      await check.checkBearer(req, sandbox.id);
      return grant("bearer", { consumedAuthorization: true });
    } catch (err) {
      if (!(err instanceof ConnectError)) throw err;
      failures.push(err);
    }
  }
  const header = PREVIEW_TOKEN_HEADERS.map((h) => req.headers[h]).find((v) => v !== undefined);
  const headerToken = Array.isArray(header) ? header[0] : header;
  if (headerToken !== undefined) {
    if (isAuthToken(sandbox.authToken, headerToken)) return grant("token");
    failures.push(wrongToken("The preview token header"));
  }
  const queryToken = query.get(PREVIEW_TOKEN_QUERY);
  if (queryToken !== null) {
    if (isAuthToken(sandbox.authToken, queryToken)) return grant("query", { setCookie: setCookie(check, sandbox, address) });
    failures.push(wrongToken(`The ${PREVIEW_TOKEN_QUERY} parameter`));
  }
  const cookie = cookieValue(headerString(req.headers.cookie), check.cookies.name(sandbox.id));
  if (cookie !== undefined) {
    const verdict = check.cookies.verify(cookie, sandbox.id, sandbox.authToken);
    if (verdict === "ok") return grant("cookie");
    failures.push(
      verdict === "expired"
        ? unauthenticated("The preview cookie has expired: open the link with the preview token again")
        : unauthenticated("The preview cookie is not valid for this sandbox (forged, or from before the sandbox restarted and its token changed)"),
    );
  }
  if (failures.length) throw failures[0]!;
  throw unauthenticated(
    `Sandbox ${sandbox.id} is private: send its preview token (X-Sandbar-Preview-Token header or ${PREVIEW_TOKEN_QUERY} query parameter) or an API key or JWT of its organization`,
  );
}

function wrongToken(what: string): ConnectError {
  return unauthenticated(`${what} is not this sandbox's current preview token (it changes every time the sandbox starts)`);
}

function unauthenticated(message: string): ConnectError {
  const e = errors.unauthenticated();
  return new ConnectError(message, e.code);
}

function headerString(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v.join("; ") : v;
}

/** HttpOnly, scoped to the host that set it (no Domain) and to the address's path. */
function setCookie(check: AccessCheck, sandbox: PreviewSandbox, address: PreviewAddress): string {
  const path = address.prefix ? address.prefix.replace(/\/[^/]*$/, "/") : "/";
  return `${check.cookies.name(sandbox.id)}=${check.cookies.issue(sandbox.id, sandbox.authToken)}; Path=${path}; Max-Age=${COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Lax${check.secure ? "; Secure" : ""}`;
}
