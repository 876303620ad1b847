import { randomBytes } from "node:crypto";
import { exportJWK, generateKeyPair, type JWK } from "jose";
import type pg from "pg";

/** How long a replaced key stays published so tokens it signed still verify. */
const RETIRED_KEY_GRACE_MS = 24 * 3600_000;
/** A signing key older than this is replaced at start. */
const KEY_MAX_AGE_MS = 30 * 24 * 3600_000;

export interface SigningKeys {
  /** Private JWKs, the signing key first (oidc-provider signs with the first that fits). */
  keys: JWK[];
}

async function newKey(): Promise<JWK> {
  const { privateKey } = await generateKeyPair("RS256", { modulusLength: 2048, extractable: true });
  const jwk = await exportJWK(privateKey);
  return { ...jwk, kid: randomBytes(12).toString("base64url"), alg: "RS256", use: "sig" };
}

/** The issuer's keys from the database: created on first use, replaced when too old. */
export async function loadSigningKeys(pool: pg.Pool): Promise<SigningKeys> {
  await underKeyLock(pool, async (client) => {
    const { rows } = await client.query<{ created_at: Date }>(
      `select created_at from oidc_signing_key where retired_at is null order by created_at desc limit 1`,
    );
    const current = rows[0];
    if (!current || Date.now() - current.created_at.getTime() > KEY_MAX_AGE_MS) await addKey(client);
  });
  return readKeys(pool);
}

/** A new signing key; the previous ones are retired (still published for the grace period). */
export async function rotateSigningKey(pool: pg.Pool): Promise<void> {
  await underKeyLock(pool, addKey);
}

/** One transaction holding the key lock: one creator among processes. */
async function underKeyLock(pool: pg.Pool, fn: (client: pg.PoolClient) => Promise<void>): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query("begin");
    await client.query("select pg_advisory_xact_lock(7012)");
    await fn(client);
    await client.query("commit");
  } catch (err) {
    await client.query("rollback").catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

async function addKey(client: pg.PoolClient): Promise<void> {
  await client.query(`update oidc_signing_key set retired_at = now() where retired_at is null`);
  await client.query(`delete from oidc_signing_key where retired_at < now() - make_interval(secs => $1)`, [RETIRED_KEY_GRACE_MS / 1000]);
  const jwk = await newKey();
  await client.query(`insert into oidc_signing_key (kid, private_jwk) values ($1, $2)`, [jwk.kid, jwk]);
}

export async function readKeys(pool: pg.Pool): Promise<SigningKeys> {
  const { rows } = await pool.query<{ private_jwk: JWK }>(
    `select private_jwk from oidc_signing_key
      where retired_at is null or retired_at > now() - make_interval(secs => $1)
      order by retired_at is not null, created_at desc`,
    [RETIRED_KEY_GRACE_MS / 1000],
  );
  return { keys: rows.map((r) => r.private_jwk) };
}

/** Drops retired keys now (their tokens stop verifying); used by operators and tests. */
export async function removeRetiredKeys(pool: pg.Pool): Promise<void> {
  await pool.query(`delete from oidc_signing_key where retired_at is not null`);
}

/** The public half of each key, as published at jwks_uri. */
export function publicJwks(keys: SigningKeys): { keys: JWK[] } {
  return { keys: keys.keys.map(({ kty, n, e, kid, alg, use }) => ({ kty, n, e, kid, alg, use })) };
}

/** Cookie-signing secrets, shared by every process through the database. */
export async function cookieKeys(pool: pg.Pool): Promise<string[]> {
  await pool.query(`insert into oidc_secret (name, value) values ('cookie', $1) on conflict (name) do nothing`, [randomBytes(32).toString("base64url")]);
  const { rows } = await pool.query<{ value: string }>(`select value from oidc_secret where name = 'cookie'`);
  return [rows[0]!.value];
}
