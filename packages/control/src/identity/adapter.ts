import { createHash } from "node:crypto";
import type pg from "pg";
import type { Adapter, AdapterPayload } from "oidc-provider";

/**
 * Kinds whose id is a bearer secret (the token value itself): stored only as its SHA-256, and the
 * payload's copy of it (`jti`) left out, so a database dump holds no usable code or token.
 */
const SECRET_IDS = new Set(["AccessToken", "AuthorizationCode", "RefreshToken", "ClientCredentials"]);

/**
 * oidc-provider's storage in PostgreSQL, so every control process sees the same sessions,
 * codes, grants and refresh tokens. One table; `kind` is the model name.
 */
export function pgAdapter(pool: pg.Pool): new (name: string) => Adapter {
  return class PgAdapter implements Adapter {
    private readonly kind: string;
    private readonly hashed: boolean;
    constructor(kind: string) {
      this.kind = kind;
      this.hashed = SECRET_IDS.has(kind);
    }

    private key(id: string): string {
      return this.hashed ? createHash("sha256").update(id).digest("hex") : id;
    }

    async upsert(id: string, payload: AdapterPayload, expiresIn: number): Promise<void> {
      await pool.query(
        `insert into oidc_payload (kind, id, payload, grant_id, user_code, uid, expires_at)
         values ($1, $2, $3, $4, $5, $6, case when $7::int > 0 then now() + make_interval(secs => $7::int) end)
         on conflict (kind, id) do update set payload = excluded.payload, grant_id = excluded.grant_id,
           user_code = excluded.user_code, uid = excluded.uid, expires_at = excluded.expires_at`,
        [this.kind, this.key(id), this.hashed ? { ...payload, jti: undefined } : payload, payload.grantId ?? null, payload.userCode ?? null, payload.uid ?? null, expiresIn ?? 0],
      );
    }

    private async one(where: string, value: string): Promise<AdapterPayload | undefined> {
      const { rows } = await pool.query<{ payload: AdapterPayload; consumed_at: Date | null }>(
        `select payload, consumed_at from oidc_payload
          where kind = $1 and ${where} = $2 and (expires_at is null or expires_at > now())`,
        [this.kind, value],
      );
      const row = rows[0];
      if (!row) return undefined;
      return row.consumed_at ? { ...row.payload, consumed: Math.floor(row.consumed_at.getTime() / 1000) } : row.payload;
    }

    async find(id: string) {
      const payload = await this.one("id", this.key(id));
      return payload && this.hashed ? { ...payload, jti: id } : payload;
    }
    findByUserCode(userCode: string) {
      return this.one("user_code", userCode);
    }
    findByUid(uid: string) {
      return this.one("uid", uid);
    }

    async consume(id: string): Promise<void> {
      await pool.query(`update oidc_payload set consumed_at = now() where kind = $1 and id = $2`, [this.kind, this.key(id)]);
    }
    async destroy(id: string): Promise<void> {
      await pool.query(`delete from oidc_payload where kind = $1 and id = $2`, [this.kind, this.key(id)]);
    }
    async revokeByGrantId(grantId: string): Promise<void> {
      await pool.query(`delete from oidc_payload where grant_id = $1`, [grantId]);
    }
  };
}

/** Expired rows are dead weight: removed now and then by whichever process runs this. */
export async function purgeExpired(pool: pg.Pool): Promise<void> {
  await pool.query(`delete from oidc_payload where expires_at < now() - interval '1 hour'`);
}
