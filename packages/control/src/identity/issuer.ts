import type { IncomingMessage, ServerResponse } from "node:http";
import Provider, { errors as oidcErrors, type Configuration } from "oidc-provider";
import type pg from "pg";
import { pgAdapter, purgeExpired } from "./adapter.ts";
import { cookieKeys, loadSigningKeys, publicJwks, readKeys, rotateSigningKey, type SigningKeys } from "./keys.ts";
import { errorPage, loginPage } from "./login-page.ts";
import { addressKey, LoginThrottle, type LoginThrottleOptions } from "./login-throttle.ts";
import { verifyPassword } from "./passwords.ts";
import { clientAddress } from "../server/client-address.ts";

/** Where the built-in issuer is mounted on the server's one port. */
export const ISSUER_PATH = "/oidc";
const DEFAULT_CLIENT_ID = "sandbar-cli";
/** The scope the API's access tokens carry. */
const API_SCOPE = "api";
/** How often keys are re-read from the database (rotation by another process, key age). */
const KEY_REFRESH_MS = 10 * 60_000;
/** A form body larger than this is not a login. */
const MAX_FORM = 16 * 1024;
/** An address a user signed in from stays known-good (no sign-in slowdown) this long after their last sign-in from it. */
const KNOWN_ADDRESS_DAYS = 90;

export interface BuiltInIssuer {
  issuer: string;
  clientId: string;
  audience: string;
  /** Serves requests under ISSUER_PATH. */
  handle(req: IncomingMessage, res: ServerResponse): void;
  /** The keys tokens are verified with (the built-in issuer is not fetched over the network). */
  jwks(): { keys: import("jose").JWK[] };
  /** Adds a signing key; the previous one keeps verifying for the grace period. */
  rotateKeys(): Promise<void>;
  /** Re-reads the keys from the database (after a rotation by another process, or a removal). */
  reloadKeys(): Promise<void>;
  close(): void;
}

interface Account {
  id: string;
  email: string;
  name: string;
}

/**
 * An OpenID Connect issuer (oidc-provider) for the embedded default: authorization code with
 * PKCE for one public client (the CLI and SDKs, loopback redirects on any port per RFC 8252),
 * refresh tokens, JWT access tokens for the API audience, a server-rendered login page.
 * Its state and keys live in PostgreSQL, so every control process serves the same issuer.
 */
export async function startIssuer(opts: {
  pool: pg.Pool;
  publicUrl: string;
  clientId?: string;
  log: (line: string) => void;
  /** Where the sign-in throttle counts (as the rate limits: "postgres" when processes share the database), and its figures (tests shrink them). */
  throttle?: { store: "memory" | "postgres"; options?: Partial<LoginThrottleOptions> };
}): Promise<BuiltInIssuer> {
  const { pool } = opts;
  const issuer = opts.publicUrl + ISSUER_PATH;
  const audience = opts.publicUrl + "/api";
  const clientId = opts.clientId ?? DEFAULT_CLIENT_ID;
  let keys = await loadSigningKeys(pool);
  const cookies = await cookieKeys(pool);

  const findAccount = async (id: string): Promise<Account | undefined> => {
    const { rows } = await pool.query<Account>(`select id, email, name from "user" where id = $1`, [id]);
    return rows[0];
  };

  const build = (signing: SigningKeys): Provider => {
    const config: Configuration = {
      adapter: pgAdapter(pool),
      clients: [
        {
          client_id: clientId,
          client_name: "Sandbar CLI",
          application_type: "native",
          token_endpoint_auth_method: "none",
          grant_types: ["authorization_code", "refresh_token"],
          response_types: ["code"],
          // Native clients: the port of a loopback redirect is not compared (RFC 8252 7.3).
          redirect_uris: ["http://127.0.0.1/callback", "http://[::1]/callback"],
        },
      ],
      jwks: { keys: signing.keys },
      cookies: { keys: cookies },
      claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"] },
      scopes: ["openid", "offline_access", "email", "profile", API_SCOPE],
      pkce: { required: () => true },
      interactions: { url: (_ctx, interaction) => `${ISSUER_PATH}/interaction/${interaction.uid}` },
      features: {
        devInteractions: { enabled: false },
        revocation: { enabled: true },
        resourceIndicators: {
          enabled: true,
          defaultResource: () => audience,
          useGrantedResource: () => true,
          getResourceServerInfo: (_ctx, resource) => {
            if (resource !== audience) throw new oidcErrors.InvalidTarget();
            return { scope: API_SCOPE, audience, accessTokenTTL: 3600, accessTokenFormat: "jwt", jwt: { sign: { alg: "RS256" } } };
          },
        },
      },
      async findAccount(_ctx, sub) {
        const account = await findAccount(sub);
        if (!account) return undefined;
        return { accountId: sub, claims: async () => ({ sub, email: account.email, email_verified: true, name: account.name }) };
      },
      // Refresh tokens whenever the client may use them (not only with offline_access + consent).
      issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed("refresh_token"),
      rotateRefreshToken: true,
      ttl: { AccessToken: 3600, AuthorizationCode: 60, IdToken: 3600, Interaction: 600, Session: 14 * 86400, Grant: 30 * 86400, RefreshToken: 30 * 86400 },
      renderError(ctx, out) {
        ctx.type = "html";
        ctx.body = errorPage(String(out.error_description ?? out.error));
      },
    };
    const provider = new Provider(issuer, config);
    provider.proxy = true; // behind SANDBAR_PUBLIC_URL's reverse proxy, if any
    return provider;
  };

  const throttle = new LoginThrottle(opts.throttle?.store === "postgres" ? { kind: "postgres", pool } : { kind: "memory" }, opts.throttle?.options);
  let provider = build(keys);
  let callback = provider.callback();

  async function interaction(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    const uid = /^\/interaction\/([\w-]+)(\/login)?$/.exec(path);
    if (!uid) return send(res, 404, errorPage("Not found"));
    let details;
    try {
      details = await provider.interactionDetails(req, res);
    } catch {
      return send(res, 400, errorPage("This sign-in request has expired or is invalid. Start again from your application."));
    }
    if (details.uid !== uid[1]) return send(res, 400, errorPage("This sign-in request does not match your browser session."));
    if (details.prompt.name === "consent" && details.session?.accountId) return consent(req, res, details);
    const action = `${ISSUER_PATH}/interaction/${details.uid}/login`;
    const clientName = "Sandbar CLI";
    if (req.method === "GET" && !uid[2]) return send(res, 200, loginPage({ action, clientName }));
    if (req.method !== "POST" || !uid[2]) return send(res, 405, errorPage("Method not allowed"));

    const form = await readForm(req);
    if (!form) return send(res, 400, errorPage("The form could not be read."));
    const login = (form.get("login") ?? "").trim();
    const password = form.get("password") ?? "";
    const address = clientAddress(req);
    const tooMany = (ms: number) =>
      send(res, 429, loginPage({ action, clientName, login, error: "Too many failed sign-ins from your address; wait a few minutes and try again." }), { "retry-after": String(Math.ceil(ms / 1000)) });
    // Only this address's own failures refuse it (see LoginThrottle), never other addresses' guesses.
    const addressRefused = await throttle.addressRefusedFor(address);
    if (addressRefused > 0) return tooMany(addressRefused);
    const user = login ? await findLogin(pool, login) : undefined;
    const admission = await throttle.begin(user?.id ?? `login:${login.toLowerCase()}`, address);
    if (admission.refused) return tooMany(admission.retryAfterMs);
    // Same work whether or not the login names someone: no user enumeration by timing.
    const ok = (await verifyPassword(password, user?.passwordHash ?? DUMMY_HASH)) && !!user && password !== "";
    // The right password from where this user signed in before is not slowed by others' guesses.
    if (!(ok && (await knownAddress(pool, user.id, address))) && admission.delayMs > 0) await sleep(admission.delayMs);
    if (!ok) return send(res, 401, loginPage({ action, clientName, login, error: "Wrong e-mail, user name or password." }));
    await throttle.succeeded(user.id, address);
    await rememberAddress(pool, user.id, address);
    await provider.interactionFinished(req, res, { login: { accountId: user.id } }, { mergeWithLastSubmission: false });
  }

  /** The CLI is a first-party client: what it asks for is granted without a consent page. */
  async function consent(req: IncomingMessage, res: ServerResponse, details: Awaited<ReturnType<Provider["interactionDetails"]>>): Promise<void> {
    const { Grant } = provider;
    const missing = details.prompt.details as { missingOIDCScope?: string[]; missingOIDCClaims?: string[]; missingResourceScopes?: Record<string, string[]> };
    const existing = details.grantId ? await Grant.find(details.grantId) : undefined;
    const grant = existing ?? new Grant({ accountId: details.session!.accountId, clientId: String(details.params.client_id) });
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(" "));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) grant.addResourceScope(resource, scopes.join(" "));
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: existing ? {} : { grantId } }, { mergeWithLastSubmission: true });
  }

  // Housekeeping: expired rows go; a key past its age is replaced, and a rotation made by
  // another control process is picked up here.
  const purge = setInterval(() => {
    void purgeExpired(pool).catch(() => {});
    void pool.query(`delete from sign_in_address where last_sign_in_at < now() - make_interval(days => $1)`, [KNOWN_ADDRESS_DAYS]).catch(() => {});
  }, 3600_000);
  purge.unref();
  const refresh = setInterval(() => {
    void loadSigningKeys(pool)
      .then((latest) => {
        const kids = (k: SigningKeys) => k.keys.map((j) => j.kid).join(",");
        if (kids(latest) !== kids(keys)) return self.reloadKeys();
      })
      .catch(() => {});
  }, KEY_REFRESH_MS);
  refresh.unref();

  const self: BuiltInIssuer = {
    issuer,
    clientId,
    audience,
    handle(req, res) {
      const original = req.url ?? "/";
      const path = original.slice(ISSUER_PATH.length) || "/";
      if (path.startsWith("/interaction/")) {
        interaction(req, res, path.split("?")[0]!).catch(() => send(res, 500, errorPage("Sign-in failed; try again.")));
        return;
      }
      // oidc-provider derives its mount path from originalUrl versus url.
      (req as IncomingMessage & { originalUrl?: string }).originalUrl = original;
      req.url = path;
      void callback(req, res);
    },
    jwks: () => publicJwks(keys),
    async rotateKeys() {
      await rotateSigningKey(pool);
      await self.reloadKeys();
      opts.log("built-in issuer: signing key rotated");
    },
    async reloadKeys() {
      keys = await readKeys(pool);
      provider = build(keys);
      callback = provider.callback();
    },
    close() {
      clearInterval(purge);
      clearInterval(refresh);
    },
  };
  return self;
}

/** The user a login (e-mail or user id) names, with their password hash, if they have one. */
async function findLogin(pool: pg.Pool, login: string): Promise<{ id: string; passwordHash: string } | undefined> {
  const { rows } = await pool.query<{ id: string; password_hash: string }>(
    `select u.id, p.password_hash from "user" u join user_password p on p.user_id = u.id
      where u.id = $1 or (u.email <> '' and lower(u.email) = lower($1)) order by u.id = $1 desc limit 1`,
    [login],
  );
  return rows[0] && { id: rows[0].id, passwordHash: rows[0].password_hash };
}

/** True when the user has signed in from this address (an IPv6 one by its /64) within KNOWN_ADDRESS_DAYS. */
async function knownAddress(pool: pg.Pool, userId: string, address: string): Promise<boolean> {
  const { rows } = await pool.query(
    `select 1 from sign_in_address where user_id = $1 and address = $2 and last_sign_in_at > now() - make_interval(days => $3)`,
    [userId, addressKey(address).slice(0, 64), KNOWN_ADDRESS_DAYS],
  );
  return rows.length > 0;
}

async function rememberAddress(pool: pg.Pool, userId: string, address: string): Promise<void> {
  await pool.query(
    `insert into sign_in_address (user_id, address) values ($1, $2)
     on conflict (user_id, address) do update set last_sign_in_at = now()`,
    [userId, addressKey(address).slice(0, 64)],
  );
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

const DUMMY_HASH = "scrypt$32768$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

function readForm(req: IncomingMessage): Promise<URLSearchParams | undefined> {
  return new Promise((resolve) => {
    if (!/^application\/x-www-form-urlencoded\b/i.test(req.headers["content-type"] ?? "")) return resolve(undefined);
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > MAX_FORM) {
        resolve(undefined);
        req.destroy();
      } else chunks.push(c);
    });
    req.on("end", () => resolve(new URLSearchParams(Buffer.concat(chunks).toString("utf8"))));
    req.on("error", () => resolve(undefined));
  });
}

function send(res: ServerResponse, status: number, html: string, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, {
    ...headers,
    "content-type": "text/html; charset=utf-8",
    "cache-control": "no-store",
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
  });
  res.end(html);
}
