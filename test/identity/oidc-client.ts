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

/** The few cookies a sign-in needs, sent on every request to the issuer (paths ignored). */
class CookieJar {
  private readonly cookies = new Map<string, string>();
  header(): string {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join("; ");
  }
  take(res: Response): void {
    for (const line of res.headers.getSetCookie()) {
      const [pair = "", ...attrs] = line.split(";");
      const eq = pair.indexOf("=");
      const name = pair.slice(0, eq).trim();
      const value = pair.slice(eq + 1).trim();
      const expired = attrs.some((a) => /^\s*expires=/i.test(a) && Date.parse(a.slice(a.indexOf("=") + 1)) <= Date.now()) || attrs.some((a) => /^\s*max-age=0\s*$/i.test(a));
      if (expired || value === "") this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
  }
}

/**
 * A sign-in at the built-in issuer without a browser: the authorization request (PKCE), the
 * login form posted as a browser posts it (optionally "from" an address, through a trusted
 * proxy's X-Forwarded-For), the redirects followed by hand to the loopback callback (never
 * listened on: the code is read from the redirect), and the token exchange.
 */
export class FormSignIn {
  readonly redirectUri = "http://127.0.0.1:9/callback";
  private readonly jar = new CookieJar();
  private readonly verifier: string;
  private readonly challenge: string;
  private readonly oidc: Discovery;
  private action = "";

  private constructor(oidc: Discovery) {
    this.oidc = oidc;
    ({ verifier: this.verifier, challenge: this.challenge } = pkce());
  }

  /** Opens the login page of a new authorization request. */
  static async start(oidc: Discovery): Promise<FormSignIn> {
    const s = new FormSignIn(oidc);
    const authorize = new URL(oidc.authorization_endpoint);
    for (const [k, v] of Object.entries({
      client_id: "sandbar-cli", response_type: "code", redirect_uri: s.redirectUri, scope: "openid email profile offline_access",
      code_challenge: s.challenge, code_challenge_method: "S256", state: "st", prompt: "login",
    })) authorize.searchParams.set(k, v);
    const page = await s.follow(authorize.href);
    if (!("html" in page) || !page.html.includes("Sign in to Sandbar")) throw new Error(`no login page: ${JSON.stringify(page)}`);
    s.action = /action="([^"]+)"/.exec(page.html)![1]!;
    return s;
  }

  /** Posts the login form; answers the page's status and text, or the code when the sign-in went through. */
  async submit(login: string, password: string, from?: string): Promise<{ status: number; html: string; code?: string; ms: number }> {
    const started = Date.now();
    const res = await fetch(new URL(this.action, this.oidc.issuer), {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": "application/x-www-form-urlencoded", cookie: this.jar.header(), ...(from ? { "x-forwarded-for": from } : {}) },
      body: new URLSearchParams({ login, password }),
      signal: AbortSignal.timeout(30_000),
    });
    this.jar.take(res);
    const ms = Date.now() - started;
    if (res.status < 300 || res.status >= 400) return { status: res.status, html: await res.text(), ms };
    const next = await this.follow(new URL(res.headers.get("location")!, this.oidc.issuer).href);
    if (!("code" in next)) throw new Error(`signed in, but no code: ${JSON.stringify(next)}`);
    return { status: res.status, html: "", code: next.code, ms };
  }

  /** Exchanges a code for tokens. */
  exchange(code: string) {
    return tokenRequest(this.oidc.token_endpoint, { grant_type: "authorization_code", code, redirect_uri: this.redirectUri, client_id: "sandbar-cli", code_verifier: this.verifier });
  }

  /** GETs through the issuer's redirects: to a page (html) or to the callback (code). */
  private async follow(url: string): Promise<{ code: string } | { status: number; html: string }> {
    for (let hops = 0; hops < 10; hops++) {
      if (url.startsWith(this.redirectUri)) {
        const q = new URL(url).searchParams;
        if (!q.get("code")) throw new Error(`callback without a code: ${url}`);
        return { code: q.get("code")! };
      }
      const res = await fetch(url, { redirect: "manual", headers: { cookie: this.jar.header() } });
      this.jar.take(res);
      const location = res.headers.get("location");
      if (res.status >= 300 && res.status < 400 && location) {
        await res.arrayBuffer();
        url = new URL(location, url).href;
        continue;
      }
      return { status: res.status, html: await res.text() };
    }
    throw new Error("too many redirects");
  }
}
