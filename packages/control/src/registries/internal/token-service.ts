import { createPrivateKey, createSign, type KeyObject, randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import type { ForeignAdmission } from "../../call/chain.ts";
import type { CredentialGrant } from "./credentials.ts";

// The token service of the internal registry (Docker's token authentication: the registry answers
// 401 with a Bearer challenge naming this realm; the client brings its username and secret here
// and gets a JWT listing what it may do; the registry checks the JWT against our certificate).
// An account only ever gets pull/push on repositories under its organization's namespace. An
// adapter of the call chain: the credentials are checked through its foreign admission (failed
// attempts throttled by the client's address, as API keys are).

/** Tokens live this long at most, and never past their account's expiry. */
const TOKEN_SECONDS = 300;

export interface TokenServiceOptions {
  /** The `service` the registry's config names (the JWT's audience). */
  service: string;
  issuer: string;
  /** PEM private key and the DER of its certificate (the JWT header's x5c). */
  keyPem: string;
  certDer: Buffer;
  /** An unexpired account's grant, else undefined. */
  verify(username: string, secret: string): Promise<CredentialGrant | undefined>;
  /** The call chain's way in for credentials of this protocol. */
  admit: ForeignAdmission;
  /** The namespace (first path component) the organization's repositories live under. */
  namespaceOf(organizationId: string): string;
  /** Where to listen; default a free loopback port (the embedded registry's realm). */
  listen?: { host: string; port: number };
  log: (line: string) => void;
}

export interface TokenService {
  realm: string;
  stop(): Promise<void>;
}

interface Access {
  type: string;
  name: string;
  actions: string[];
}

/** What `scope` params ask for, limited to what the grant allows (nothing outside the namespace). */
export function grantedAccess(scopes: string[], grant: CredentialGrant, namespace: string): Access[] {
  const allowed = new Set(grant.actions.split(","));
  const out: Access[] = [];
  for (const scope of scopes) {
    const parts = scope.split(":");
    if (parts.length < 3) continue;
    const type = parts[0]!;
    const actions = parts.at(-1)!.split(",");
    const name = parts.slice(1, -1).join(":");
    // The catalog and other organizations' repositories: nothing (the registry then refuses).
    if (type !== "repository" || !name.startsWith(`${namespace}/`) || name.length === namespace.length + 1) continue;
    const granted = actions.filter((a) => allowed.has(a));
    if (granted.length) out.push({ type, name, actions: granted });
  }
  return out;
}

/** The distribution spec's error codes by status. */
const ERROR_CODES: Record<number, string> = { 400: "BAD_REQUEST", 401: "UNAUTHORIZED", 404: "NOT_FOUND", 429: "TOOMANYREQUESTS" };

const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");

function basicAuth(header: string | undefined): { username: string; secret: string } | undefined {
  const m = /^Basic ([A-Za-z0-9+/=]+)$/.exec(header ?? "");
  if (!m) return undefined;
  const text = Buffer.from(m[1]!, "base64").toString("utf8");
  const colon = text.indexOf(":");
  if (colon <= 0) return undefined;
  return { username: text.slice(0, colon), secret: text.slice(colon + 1) };
}

export async function startTokenService(o: TokenServiceOptions): Promise<TokenService> {
  const key: KeyObject = createPrivateKey(o.keyPem);
  const sign = (claims: object) => {
    const header = { alg: "RS256", typ: "JWT", x5c: [o.certDer.toString("base64")] };
    const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    return `${input}.${b64url(createSign("RSA-SHA256").update(input).sign(key))}`;
  };
  const refuse = (res: http.ServerResponse, status: number, message: string) =>
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ errors: [{ code: ERROR_CODES[status] ?? "UNAVAILABLE", message }] }));

  const server = http.createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url ?? "/", "http://token");
      if (req.method !== "GET" || url.pathname !== "/token") return refuse(res, 404, "not found");
      const given = basicAuth(req.headers.authorization);
      let grant: CredentialGrant | undefined;
      try {
        await o.admit(req, async () => {
          // Anonymous tokens would only ever carry nothing: ask for credentials instead.
          grant = given ? await o.verify(given.username, given.secret) : undefined;
          if (!grant) throw errors.unauthenticated();
          return { organizationId: grant.organizationId };
        });
      } catch (err) {
        const blocked = err instanceof ConnectError && err.code === Code.ResourceExhausted;
        return refuse(res, blocked ? 429 : 401, blocked ? err.rawMessage : "incorrect username or secret, or the credentials expired");
      }
      if (!given || !grant) return refuse(res, 401, "incorrect username or secret, or the credentials expired");
      const service = url.searchParams.get("service");
      if (service !== o.service) return refuse(res, 400, `unknown service ${JSON.stringify(service)}`);
      const now = Math.floor(Date.now() / 1000);
      const exp = Math.min(now + TOKEN_SECONDS, Math.floor(grant.expiresAt.getTime() / 1000));
      const access = grantedAccess(url.searchParams.getAll("scope"), grant, o.namespaceOf(grant.organizationId));
      const token = sign({ iss: o.issuer, sub: given.username, aud: o.service, exp, nbf: now - 10, iat: now, jti: randomBytes(12).toString("hex"), access });
      res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(
        JSON.stringify({ token, access_token: token, expires_in: Math.max(exp - now, 1), issued_at: new Date(now * 1000).toISOString() }),
      );
    })().catch((err: unknown) => {
      o.log(`internal registry: token service: ${err instanceof Error ? err.message : String(err)}`);
      if (!res.headersSent) refuse(res, 503, "token service unavailable");
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.listen?.port ?? 0, o.listen?.host ?? "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const host = o.listen?.host ?? "127.0.0.1";
  return {
    realm: `http://${host === "0.0.0.0" ? "<this host>" : host}:${port}/token`,
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
