import { createHash, randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/** What a CLI does around the browser: PKCE, a loopback redirect listener, the token exchange. */
export interface Discovery {
  issuer: string;
  authorization_endpoint: string;
  token_endpoint: string;
  jwks_uri: string;
}

export async function discover(issuer: string): Promise<Discovery> {
  const res = await fetch(`${issuer}/.well-known/openid-configuration`);
  if (!res.ok) throw new Error(`discovery: ${res.status}`);
  return (await res.json()) as Discovery;
}

export function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString("base64url");
  return { verifier, challenge: createHash("sha256").update(verifier).digest("base64url") };
}

/** A loopback listener on a random port, as RFC 8252 native apps use; resolves with the callback's query. */
export async function loopback(): Promise<{ redirectUri: string; received: Promise<URLSearchParams>; server: Server }> {
  let deliver!: (q: URLSearchParams) => void;
  const received = new Promise<URLSearchParams>((r) => (deliver = r));
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    if (url.pathname !== "/callback") return void res.writeHead(404).end();
    res.writeHead(200, { "content-type": "text/html" }).end("<p>Signed in; you may close this window.</p>");
    deliver(url.searchParams);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return { redirectUri: `http://127.0.0.1:${port}/callback`, received, server };
}

export async function tokenRequest(endpoint: string, form: Record<string, string>): Promise<{ status: number; body: Record<string, string> }> {
  const res = await fetch(endpoint, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(form) });
  return { status: res.status, body: (await res.json()) as Record<string, string> };
}
