import { createLocalJWKSet, createRemoteJWKSet, jwtVerify, type JSONWebKeySet, type JWTPayload, type JWTVerifyGetKey } from "jose";
import { errors } from "@sandbar/protocol";

/**
 * Asymmetric algorithms only: `none` and the HMAC family (whose "key" would be the public key
 * anyone can fetch) are never accepted.
 */
const JWT_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"];
const CLOCK_TOLERANCE_S = 30;
/** A failed discovery is retried no more often than this. */
const DISCOVERY_RETRY_MS = 5_000;

export interface JwtIssuerOptions {
  /** The issuer URL (its discovery document is at /.well-known/openid-configuration). */
  issuer: string;
  audience: string;
  /** Keys known locally (the built-in issuer); otherwise the discovery document's jwks_uri is fetched. */
  localKeys?: () => JSONWebKeySet;
  /** How long fetched keys are trusted before the JWKS is read again (default 10 minutes). */
  jwksCacheMs?: number;
  /**
   * Subjects this issuer may not speak for: an external issuer's `sub` is a user id here, and
   * must not name the local bootstrap admin.
   */
  reservedSubjects?: readonly string[];
  /** Minimum time between JWKS reads triggered by an unknown kid (default 30 s). */
  jwksCooldownMs?: number;
}

/** The claims a verified token carries about its subject. */
export interface VerifiedClaims {
  sub: string;
  email: string;
  emailVerified: boolean;
  name: string;
  /** `iat` (seconds since the epoch), when the token carries it: a deleted user's older tokens are refused by it. */
  issuedAt?: number;
}

/**
 * Verifies bearer JWTs against one OpenID issuer: signature (keys from the issuer's JWKS,
 * refetched when a token names an unknown kid, so rotation needs nothing here), issuer,
 * audience, expiry and not-before, algorithm allow-list.
 */
export class JwtVerifier {
  private readonly opts: JwtIssuerOptions;
  private remote?: { issuer: string; keys: JWTVerifyGetKey };
  private discovering?: Promise<void>;
  private lastFailure = 0;
  private localCache?: { source: JSONWebKeySet; keys: JWTVerifyGetKey };

  constructor(opts: JwtIssuerOptions) {
    this.opts = opts;
  }

  get issuer(): string {
    return this.opts.issuer;
  }

  async verify(token: string): Promise<VerifiedClaims> {
    const { issuer, keys } = await this.keySource();
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, keys, {
        issuer,
        audience: this.opts.audience,
        algorithms: JWT_ALGORITHMS,
        clockTolerance: CLOCK_TOLERANCE_S,
        requiredClaims: ["sub", "exp"],
      }));
    } catch {
      // Bad signature, claims or format, and an unreachable JWKS alike: the token is not accepted.
      throw errors.unauthenticated();
    }
    const claims = claimsOf(payload);
    if (this.opts.reservedSubjects?.includes(claims.sub)) throw errors.unauthenticated();
    return claims;
  }

  private async keySource(): Promise<{ issuer: string; keys: JWTVerifyGetKey }> {
    if (this.opts.localKeys) {
      const source = this.opts.localKeys();
      if (this.localCache?.source !== source) this.localCache = { source, keys: createLocalJWKSet(source) };
      return { issuer: this.opts.issuer, keys: this.localCache.keys };
    }
    if (!this.remote) {
      if (Date.now() - this.lastFailure < DISCOVERY_RETRY_MS) throw errors.unavailable("Temporary authentication service error");
      await (this.discovering ??= this.discover().finally(() => (this.discovering = undefined)));
    }
    return this.remote!;
  }

  /** Reads the discovery document; its issuer must be the configured one (OpenID Discovery 4.3). */
  private async discover(): Promise<void> {
    const base = this.opts.issuer.replace(/\/+$/, "");
    try {
      const res = await fetch(`${base}/.well-known/openid-configuration`, { signal: AbortSignal.timeout(10_000) });
      if (!res.ok) throw new Error(`discovery answered ${res.status}`);
      const doc = (await res.json()) as { issuer?: unknown; jwks_uri?: unknown };
      if (typeof doc.issuer !== "string" || doc.issuer.replace(/\/+$/, "") !== base) throw new Error("discovery issuer mismatch");
      if (typeof doc.jwks_uri !== "string") throw new Error("discovery has no jwks_uri");
      this.remote = { issuer: doc.issuer, keys: createRemoteJWKSet(new URL(doc.jwks_uri), {
        cooldownDuration: this.opts.jwksCooldownMs ?? 30_000,
        cacheMaxAge: this.opts.jwksCacheMs ?? 600_000,
      }) };
    } catch {
      this.lastFailure = Date.now();
      throw errors.unavailable("Temporary authentication service error");
    }
  }
}

function claimsOf(payload: JWTPayload): VerifiedClaims {
  const str = (v: unknown) => (typeof v === "string" ? v : "");
  const sub = str(payload.sub);
  if (!sub || sub.length > 255) throw errors.unauthenticated();
  return {
    sub,
    email: str(payload.email),
    emailVerified: payload.email_verified === true,
    name: str(payload.name) || str(payload.username) || str(payload.preferred_username) || "Unknown",
    ...(typeof payload.iat === "number" && Number.isFinite(payload.iat) ? { issuedAt: payload.iat } : {}),
  };
}
