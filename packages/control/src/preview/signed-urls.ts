import { createHash, randomBytes } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";

/** Lifetime bounds of a signed preview URL, in seconds (the reference's). */
const SIGNED_DEFAULT_S = 60;
const SIGNED_MAX_S = 86_400;

const hash = (token: string) => createHash("sha256").update(token).digest("hex");

/** A fresh token: 16 lower-case letters and digits (URL-safe, fits a DNS label). */
function newToken(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  let out = "";
  // 36 * 7 = 252: bytes >= 252 are dropped so each character is uniform.
  while (out.length < 16) for (const b of randomBytes(24)) if (b < 252 && out.length < 16) out += alphabet[b % 36];
  return out;
}

/**
 * Signed preview URLs: a token that opens one port of one sandbox until it expires. Stored as
 * its SHA-256 (the token is the credential), with the port and expiry; expired rows are removed
 * when new ones are made.
 */
export class SignedPreviewUrls {
  readonly #orm: MikroORM;
  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  async create(sandboxId: string, port: number, expiresInSeconds: number | undefined): Promise<string> {
    const seconds = expiresInSeconds ?? SIGNED_DEFAULT_S;
    if (!Number.isInteger(seconds) || seconds < 1 || seconds > SIGNED_MAX_S) throw errors.invalidArgument("expiresInSeconds must be between 1 second and 24 hours");
    const token = newToken();
    const conn = this.#orm.em.getConnection();
    await conn.execute(`delete from signed_preview_url where expires_at < now()`);
    await conn.execute(`insert into signed_preview_url (token_hash, sandbox_id, port, expires_at) values (?, ?, ?, now() + make_interval(secs => ?))`, [hash(token), sandboxId, port, seconds]);
    return token;
  }

  /** The sandbox a token opens `port` of, with when it stops; undefined when unknown, expired or for another port. */
  async resolve(token: string, port: number): Promise<{ sandboxId: string; expiresAt: Date } | undefined> {
    const rows = (await this.#orm.em
      .getConnection()
      .execute(`select sandbox_id, expires_at from signed_preview_url where token_hash = ? and port = ? and expires_at > now()`, [hash(token), port])) as Array<{ sandbox_id: string; expires_at: Date }>;
    const row = rows[0];
    return row ? { sandboxId: row.sandbox_id, expiresAt: new Date(row.expires_at) } : undefined;
  }

  /** Ends a token now (nothing happens for an unknown one). */
  async expire(sandboxId: string, port: number, token: string): Promise<void> {
    await this.#orm.em.getConnection().execute(`delete from signed_preview_url where token_hash = ? and sandbox_id = ? and port = ?`, [hash(token), sandboxId, port]);
  }
}
