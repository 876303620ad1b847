import pg from "pg";
import type { Exec } from "../db/exec.ts";
import { ConnectError, errors } from "@sandbar/protocol";
import type { JwtVerifier } from "./jwt.ts";
import { issuedTooEarly, userForClaims } from "./jwt-users.ts";
import { hashApiKey, looksLikeJwt } from "./key-material.ts";
import type { KeyIdentity, Principal } from "./principal.ts";
import type { RateLimitOverrides } from "../limits/rate-limits.ts";

/** The channel every control process listens on for revocations. */
const CHANNEL = "sandbar_auth";
/** Safety net on top of notifications: cached credentials are re-read at least this often. */
const CACHE_TTL_MS = 10_000;
/** lastUsedAt is written at most once per key per interval. */
const LAST_USED_INTERVAL_MS = 10_000;

interface CachedKey {
  principal: Principal;
  loadedAt: number;
}

/** What changed: one key, one member's access, everything cached about an organization (roles, suspension), or a user (deleted). */
export type Invalidation =
  | { kind: "key"; hash: string }
  | { kind: "member"; organizationId: string; userId: string }
  | { kind: "organization"; organizationId: string }
  | { kind: "user"; userId: string };

/** A member's standing in an organization, as the guard needs it on every call. */
export interface MemberAccess {
  /** "owner" or "member". */
  role: string;
  /** The union of the member's assigned roles' permissions (owners hold every scope regardless). */
  permissions: ReadonlySet<string>;
  /** Present while the organization is suspended: the reason ("" when none was given). */
  suspension?: string;
  /** The organization's own rate limits (cached with the access: a quota update evicts it everywhere). */
  rateLimits?: RateLimitOverrides;
}

/**
 * Resolves bearer credentials to a principal. Validated keys are cached in memory; a
 * revocation is published with NOTIFY in the same transaction that deletes the key, so
 * every control process sharing the database evicts it when the delete commits.
 */
export class Credentials {
  private readonly keys = new Map<string, CachedKey>();
  private readonly members = new Map<string, { access: MemberAccess | null; loadedAt: number; until?: number }>();
  private readonly lastUsedWrites = new Map<string, number>();
  private listener?: pg.Client;
  private syncing = false;
  private syncWaiters: Array<() => void> = [];
  private readonly pool: pg.Pool;
  private jwt?: JwtVerifier;
  /** Users behind verified JWTs, by `sub`: the user row is read at most every CACHE_TTL_MS. */
  private readonly jwtUsers = new Map<string, { principal: Principal; loadedAt: number; issuedAfter?: number }>();

  constructor(databaseUrl: string) {
    this.pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    // An idle connection dropped by the server (restart, failover) is replaced on next use.
    this.pool.on("error", () => {});
  }

  /** Accept JWTs from this issuer (without one, a JWT is 401). */
  useJwtVerifier(verifier: JwtVerifier): void {
    this.jwt = verifier;
  }

  async start(databaseUrl: string): Promise<void> {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    client.on("notification", (msg) => {
      if (msg.payload) this.evict(JSON.parse(msg.payload) as Invalidation);
    });
    client.on("error", () => this.keys.clear());
    await client.query(`LISTEN ${CHANNEL}`);
    this.listener = client;
  }

  async stop(): Promise<void> {
    await this.listener?.end().catch(() => {});
    await this.pool.end().catch(() => {});
  }

  /**
   * Tells every control process about a change; run it inside the transaction that revokes or
   * changes access (the notification is delivered when, and only if, it commits).
   */
  static async publish(exec: Exec, inv: Invalidation): Promise<void> {
    await exec("select pg_notify(?, ?)", [CHANNEL, JSON.stringify(inv)]);
  }

  /** Evicts locally at once (the notification will do the same in every process). */
  evict(inv: Invalidation): void {
    if (inv.kind === "key") this.keys.delete(inv.hash);
    else if (inv.kind === "member") this.members.delete(`${inv.organizationId}/${inv.userId}`);
    else if (inv.kind === "user") {
      this.jwtUsers.delete(inv.userId);
      for (const id of this.members.keys()) if (id.endsWith(`/${inv.userId}`)) this.members.delete(id);
    } else for (const id of this.members.keys()) if (id.startsWith(`${inv.organizationId}/`)) this.members.delete(id);
  }

  async authenticate(authorization: string | null): Promise<Principal> {
    const token = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? "")?.[1];
    if (!token) throw errors.unauthenticated();
    if (looksLikeJwt(token)) return this.authenticateJwt(token);
    const hash = hashApiKey(token);
    // Trust the caches (keys, and members right after) only once every revocation committed
    // before this request has arrived.
    await this.sync();
    const now = Date.now();
    let cached = this.keys.get(hash);
    if (!cached || now - cached.loadedAt > CACHE_TTL_MS) {
      const principal = await this.loadKey(hash);
      if (!principal) {
        this.keys.delete(hash);
        throw errors.unauthenticated();
      }
      cached = { principal, loadedAt: now };
      this.keys.set(hash, cached);
    }
    const key = cached.principal.apiKey!;
    if (key.expiresAt && key.expiresAt.getTime() <= now) throw errors.unauthenticated();
    this.touch(key, now);
    return cached.principal;
  }

  private async authenticateJwt(token: string): Promise<Principal> {
    if (!this.jwt) throw errors.unauthenticated();
    const [claims] = await Promise.all([this.jwt.verify(token), this.sync()]);
    const now = Date.now();
    const hit = this.jwtUsers.get(claims.sub);
    if (hit && now - hit.loadedAt <= CACHE_TTL_MS && (!claims.email || hit.principal.email === claims.email)) {
      // A subject deleted once and created again: its tokens from before the deletion stay refused.
      if (issuedTooEarly(claims, hit.issuedAfter)) throw errors.unauthenticated();
      return hit.principal;
    }
    let found: Awaited<ReturnType<typeof userForClaims>>;
    try {
      found = await userForClaims(this.pool, claims);
    } catch (err) {
      if (err instanceof ConnectError) throw err; // a deleted user's token: 401
      throw errors.unavailable("Temporary authentication service error");
    }
    if (this.jwtUsers.size > 10_000) this.jwtUsers.clear();
    this.jwtUsers.set(claims.sub, { principal: found.principal, loadedAt: now, issuedAfter: found.issuedAfter });
    return found.principal;
  }

  /**
   * A read barrier: resolves after a round trip on the listening connection that was sent after
   * this call. PostgreSQL delivers the notifications committed before a query ahead of its answer,
   * so a key revoked by any process before this request arrived has been evicted by then.
   * Concurrent callers share one round trip.
   */
  private sync(): Promise<void> {
    return new Promise((resolve) => {
      this.syncWaiters.push(resolve);
      if (!this.syncing) void this.flushSync();
    });
  }

  private async flushSync(): Promise<void> {
    this.syncing = true;
    while (this.syncWaiters.length) {
      const batch = this.syncWaiters;
      this.syncWaiters = [];
      try {
        // An empty query: no parse, plan or row to describe, yet answered (ReadyForQuery) only
        // after the notifications that came before it, like any query.
        await this.listener?.query("");
      } catch {
        this.keys.clear(); // notifications may have been lost: re-read everything
        this.members.clear();
      }
      for (const resolve of batch) resolve();
    }
    this.syncing = false;
  }

  /** The member's access to an organization, or null when not a member (or no such organization). */
  async memberAccess(organizationId: string, userId: string): Promise<MemberAccess | null> {
    const id = `${organizationId}/${userId}`;
    const now = Date.now();
    const hit = this.members.get(id);
    if (hit && now - hit.loadedAt <= CACHE_TTL_MS && !(hit.until && hit.until <= now)) return hit.access;
    const { rows } = await this.query<{ role: string; permissions: string[]; suspended: boolean; suspension_reason: string | null; suspended_until: Date | null } & OverrideColumns>(
      `select m.role, o.suspended, o.suspension_reason, o.suspended_until,
              o.authenticated_rate_limit, o.authenticated_rate_limit_ttl_seconds, o.sandbox_create_rate_limit,
              o.sandbox_create_rate_limit_ttl_seconds, o.sandbox_lifecycle_rate_limit, o.sandbox_lifecycle_rate_limit_ttl_seconds,
              array(select distinct unnest(r.permissions) from organization_member_role mr
                      join organization_role r on r.id = mr.role_id
                     where mr.organization_id = m.organization_id and mr.user_id = m.user_id) as permissions
         from organization_member m join organization o on o.id = m.organization_id
        where m.organization_id = $1 and m.user_id = $2`,
      [organizationId, userId],
    );
    const row = rows[0];
    // A suspension whose end has passed no longer counts (as in the reference).
    const suspended = row?.suspended && !(row.suspended_until && row.suspended_until.getTime() <= now);
    const access = row
      ? { role: row.role, permissions: new Set(row.permissions), rateLimits: overridesOf(row), ...(suspended ? { suspension: row.suspension_reason ?? "" } : {}) }
      : null;
    if (this.members.size > 50_000) this.members.clear();
    this.members.set(id, { access, loadedAt: now, until: suspended ? row?.suspended_until?.getTime() : undefined });
    return access;
  }

  private async loadKey(hash: string): Promise<Principal | null> {
    const { rows } = await this.query<{
      id: string; name: string; organization_id: string; user_id: string; permissions: string[];
      expires_at: Date | null; key_prefix: string; key_suffix: string; created_at: Date; last_used_at: Date | null;
      email: string; role: string;
    }>(
      `select k.id, k.name, k.organization_id, k.user_id, k.permissions, k.expires_at, k.key_prefix, k.key_suffix,
              k.created_at, k.last_used_at, u.email, u.role
         from api_key k join "user" u on u.id = k.user_id where k.key_hash = $1`,
      [hash],
    );
    const row = rows[0];
    if (!row) return null;
    const apiKey: KeyIdentity = {
      id: row.id,
      hash,
      name: row.name,
      organizationId: row.organization_id,
      userId: row.user_id,
      permissions: new Set(row.permissions),
      expiresAt: row.expires_at,
      prefix: row.key_prefix,
      suffix: row.key_suffix,
      createdAt: row.created_at,
      lastUsedAt: row.last_used_at,
    };
    return { kind: "api-key", userId: row.user_id, email: row.email, systemRole: row.role, apiKey };
  }

  private touch(key: KeyIdentity, now: number): void {
    key.lastUsedAt = new Date(now);
    const last = this.lastUsedWrites.get(key.hash) ?? 0;
    if (now - last < LAST_USED_INTERVAL_MS) return;
    this.lastUsedWrites.set(key.hash, now);
    this.pool.query(`update api_key set last_used_at = now() where key_hash = $1`, [key.hash]).catch(() => {});
  }

  private async query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    try {
      return await this.pool.query<R>(sql, params);
    } catch {
      throw errors.unavailable("Temporary authentication service error");
    }
  }
}

interface OverrideColumns {
  authenticated_rate_limit: number | null;
  authenticated_rate_limit_ttl_seconds: number | null;
  sandbox_create_rate_limit: number | null;
  sandbox_create_rate_limit_ttl_seconds: number | null;
  sandbox_lifecycle_rate_limit: number | null;
  sandbox_lifecycle_rate_limit_ttl_seconds: number | null;
}

function overridesOf(r: OverrideColumns): RateLimitOverrides {
  return {
    authenticated: { limit: r.authenticated_rate_limit, seconds: r.authenticated_rate_limit_ttl_seconds },
    "sandbox-create": { limit: r.sandbox_create_rate_limit, seconds: r.sandbox_create_rate_limit_ttl_seconds },
    "sandbox-lifecycle": { limit: r.sandbox_lifecycle_rate_limit, seconds: r.sandbox_lifecycle_rate_limit_ttl_seconds },
  };
}
