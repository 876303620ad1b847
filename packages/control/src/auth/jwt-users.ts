import type pg from "pg";
import { errors } from "@sandbar/protocol";
import { pgExec } from "../db/exec.ts";
import { insertOrganization } from "../organizations/new-organization.ts";
import type { VerifiedClaims } from "./jwt.ts";
import type { Principal } from "./principal.ts";

/**
 * Leeway for a deleted user's subject: a token whose `iat` is not this far past the deletion is
 * refused, so an issuer whose clock runs a little ahead cannot slip an older token through (the
 * same leeway as `exp`/`nbf`).
 */
const DELETION_LEEWAY_MS = 30_000;

/** The user behind a token, and, when the subject was deleted before, the time its tokens must be issued after. */
export interface JwtUser {
  principal: Principal;
  /** Milliseconds since the epoch: tokens issued at or before it are refused (the subject was deleted then). */
  issuedAfter?: number;
}

/** True when a token of a once-deleted subject was issued too early (or does not say when). */
export function issuedTooEarly(claims: VerifiedClaims, issuedAfter: number | undefined): boolean {
  return issuedAfter !== undefined && (claims.issuedAt === undefined || claims.issuedAt * 1000 <= issuedAfter);
}

type UserRow = { id: string; email: string; name: string; role: string; email_verified: boolean };

/**
 * The user a verified token names: found by `sub`, or created on first sign-in together with
 * a personal organization it owns (one transaction: nothing half-created). Name and e-mail are
 * refreshed from the token when it carries them, as the reference does.
 *
 * A deleted user's subject is remembered (table deleted_user): it is never provisioned again
 * from a token (401), and when the operator has created the user again, only tokens issued
 * after the deletion are accepted. A brand-new subject is provisioned as before.
 */
export async function userForClaims(pool: pg.Pool, claims: VerifiedClaims): Promise<JwtUser> {
  const client = await pool.connect();
  try {
    let { user, issuedAfter } = await lookup(client, claims);
    if (user) {
      const email = claims.email || user.email;
      const name = user.name === "Unknown" && claims.name !== "Unknown" ? claims.name : user.name;
      // A new address is as verified as the issuer says; the same one only ever becomes verified.
      const verified = email !== user.email ? claims.emailVerified : user.email_verified || claims.emailVerified;
      if (email !== user.email || name !== user.name || verified !== user.email_verified) {
        await client.query(`update "user" set email = $2, name = $3, email_verified = $4 where id = $1`, [user.id, email, name, verified]);
        user = { ...user, email, name, email_verified: verified };
      }
    } else {
      await client.query("begin");
      try {
        // Two first requests at once: the second waits here and finds the user. A deletion takes
        // the same lock, so a provisioning and a deletion never interleave.
        await client.query("select pg_advisory_xact_lock(hashtext($1))", [claims.sub]);
        ({ user, issuedAfter } = await lookup(client, claims));
        if (!user) {
          user = { id: claims.sub, email: claims.email, name: claims.name, role: "user", email_verified: claims.emailVerified };
          await client.query(`insert into "user" (id, name, email, role, email_verified) values ($1, $2, $3, 'user', $4)`, [user.id, user.name, user.email, user.email_verified]);
          await insertOrganization(pgExec(client), { name: "Personal", createdBy: user.id, personal: true });
        }
        await client.query("commit");
      } catch (err) {
        await client.query("rollback").catch(() => {});
        throw err;
      }
    }
    return { principal: { kind: "jwt", userId: user.id, email: user.email, systemRole: user.role }, issuedAfter };
  } finally {
    client.release();
  }
}

/**
 * The subject's user row, if any, and whether it was deleted once. A deleted subject without a
 * user row is refused (401): its tokens, old or new, do not provision it again (the operator
 * creates the user again if they are to return); with a row (created again) only tokens issued
 * after the deletion pass.
 */
async function lookup(client: pg.PoolClient, claims: VerifiedClaims): Promise<{ user?: UserRow; issuedAfter?: number }> {
  const { rows } = await client.query<Partial<UserRow> & { deleted_at: Date | null }>(
    `select u.id, u.email, u.name, u.role, u.email_verified, d.deleted_at
       from (select $1::varchar as sub) s left join "user" u on u.id = s.sub left join deleted_user d on d.id = s.sub`,
    [claims.sub],
  );
  const row = rows[0]!;
  const issuedAfter = row.deleted_at ? row.deleted_at.getTime() + DELETION_LEEWAY_MS : undefined;
  if (issuedAfter !== undefined && (!row.id || issuedTooEarly(claims, issuedAfter))) throw errors.unauthenticated();
  return { user: row.id ? (row as UserRow) : undefined, issuedAfter };
}
