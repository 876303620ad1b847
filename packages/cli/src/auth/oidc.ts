import { createHash, randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { CliError } from "../failure.ts";

/** The parts of an issuer's discovery document the CLI uses. */
export interface Discovery {
  issuer: string;
  authorization_endpoint: string;
  token_endpoint: string;
  revocation_endpoint?: string;
}

export interface TokenSet {
  access_token: string;
  refresh_token?: string;
  expires_in?: number;
}

/** The server's issuer and client, from its public `/config` (no credentials needed). */
export async function serverOidc(apiUrl: string): Promise<{ issuer: string; clientId: string; audience: string }> {
  const res = await fetch(`${apiUrl.replace(/\/+$/, "")}/config`);
  if (!res.ok) throw new CliError(`${apiUrl}/config answered ${res.status}: is ${apiUrl} a Sandbar API URL (ending in /api)?`);
  const body = (await res.json()) as { oidc?: { issuer?: string; clientId?: string; audience?: string } };
  const { issuer, clientId, audience } = body.oidc ?? {};
  if (!issuer || !clientId) throw new CliError(`${apiUrl} offers no sign-in (its /config names no issuer): use \`sandbar login --api-key KEY\`.`);
  return { issuer, clientId, audience: audience ?? "" };
}

export async function discover(issuer: string): Promise<Discovery> {
  const res = await fetch(`${issuer.replace(/\/+$/, "")}/.well-known/openid-configuration`);
  if (!res.ok) throw new CliError(`The issuer ${issuer} answered ${res.status} for its discovery document: check the server's identity settings.`);
  return (await res.json()) as Discovery;
}

/** RFC 7636 S256: a random verifier and its challenge. */
export function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString("base64url");
  return { verifier, challenge: createHash("sha256").update(verifier).digest("base64url") };
}

const PAGE = (text: string) => `<!doctype html><meta charset="utf-8"><title>Sandbar</title><p>${text.replace(/[<>&]/g, "")}</p>`;

/**
 * A loopback listener on a random port (RFC 8252 7.3). It resolves with the first callback
 * carrying this `state` (others are answered 400 and ignored: another tab, a stale link).
 */
export async function loopbackRedirect(state: string): Promise<{ redirectUri: string; code: Promise<string>; close(): void }> {
  let deliver!: (code: string) => void;
  let refuse!: (err: Error) => void;
  const code = new Promise<string>((res, rej) => ((deliver = res), (refuse = rej)));
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    if (url.pathname !== "/callback") return void res.writeHead(404).end();
    const q = url.searchParams;
    if (q.get("state") !== state) return void res.writeHead(400, { "content-type": "text/html" }).end(PAGE("This sign-in link is not the one the command line is waiting for."));
    const error = q.get("error");
    if (error) {
      res.writeHead(400, { "content-type": "text/html" }).end(PAGE(`Sign-in failed: ${q.get("error_description") ?? error}`));
      return refuse(new CliError(`Sign-in failed at the issuer: ${q.get("error_description") ?? error}. Run \`sandbar login\` again.`));
    }
    const value = q.get("code");
    if (!value) return void res.writeHead(400).end(PAGE("No authorization code."));
    res.writeHead(200, { "content-type": "text/html" }).end(PAGE("Signed in to Sandbar; you may close this window and return to the terminal."));
    deliver(value);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return { redirectUri: `http://127.0.0.1:${port}/callback`, code, close: () => server.close() };
}

/** A token endpoint call (authorization code or refresh); an OAuth error is a CliError saying what to do. */
export async function tokenRequest(endpoint: string, form: Record<string, string>): Promise<TokenSet> {
  const res = await fetch(endpoint, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(form) });
  const body = (await res.json().catch(() => ({}))) as Partial<TokenSet> & { error?: string; error_description?: string };
  if (!res.ok || !body.access_token) {
    const why = body.error_description ?? body.error ?? `status ${res.status}`;
    throw new CliError(form.grant_type === "refresh_token" ? `Your sign-in has expired (${why}): run \`sandbar login\`.` : `The issuer refused the sign-in (${why}): run \`sandbar login\` again.`);
  }
  return body as TokenSet;
}
