import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { exportJWK, generateKeyPair, SignJWT, type JWK } from "jose";

/** The audience test servers configured with a TestIssuer expect. */
export const AUDIENCE = "https://api.sandbar.test";

/** An independent OpenID issuer: a discovery document and a JWKS whose keys the test rotates. */
export class TestIssuer {
  url = "";
  published: JWK[] = [];
  jwksReads = 0;
  private server?: Server;
  private keys = new Map<string, Awaited<ReturnType<typeof generateKeyPair>>["privateKey"]>();

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const body =
        req.url === "/.well-known/openid-configuration"
          ? { issuer: this.url, jwks_uri: `${this.url}/jwks`, authorization_endpoint: `${this.url}/authorize`, token_endpoint: `${this.url}/token` }
          : req.url === "/jwks"
            ? (this.jwksReads++, { keys: this.published })
            : undefined;
      res.writeHead(body ? 200 : 404, { "content-type": "application/json" }).end(JSON.stringify(body ?? {}));
    });
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** A new key pair; published unless told otherwise. */
  async addKey(kid: string, publish = true): Promise<void> {
    const { publicKey, privateKey } = await generateKeyPair("RS256");
    this.keys.set(kid, privateKey);
    if (publish) this.published.push({ ...(await exportJWK(publicKey)), kid, alg: "RS256", use: "sig" });
  }

  unpublish(kid: string): void {
    this.published = this.published.filter((k) => k.kid !== kid);
  }

  /** A token for `claims`; `opts.iat` sets when it says it was issued (seconds since the epoch; default now). */
  sign(kid: string, claims: Record<string, unknown> = {}, opts: { issuer?: string; audience?: string; exp?: number | string; iat?: number } = {}): Promise<string> {
    return new SignJWT({ email: "ada@example.test", name: "Ada", ...claims })
      .setProtectedHeader({ alg: "RS256", kid, typ: "JWT" })
      .setSubject(String(claims.sub ?? "ext|ada"))
      .setIssuer(opts.issuer ?? this.url)
      .setAudience(opts.audience ?? AUDIENCE)
      .setIssuedAt(opts.iat)
      .setExpirationTime(opts.exp ?? "5m")
      .sign(this.keys.get(kid)!);
  }

  stop(): void {
    this.server?.close();
  }
}

/** Settings that make a test server trust this issuer (and switch the built-in one off). */
export function issuerSettings(issuer: TestIssuer) {
  return { oidc: { issuer: issuer.url, clientId: "sandbar-test", audience: AUDIENCE } };
}
