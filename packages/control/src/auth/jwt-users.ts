import type pg from "pg";
import { pgExec } from "../db/exec.ts";
import { insertOrganization } from "../organizations/new-organization.ts";
import type { VerifiedClaims } from "./jwt.ts";
import type { Principal } from "./principal.ts";

/**
 * The user a verified token names: found by `sub`, or created on first sign-in together with
 * a personal organization it owns (one transaction: nothing half-created). Name and e-mail are
 * refreshed from the token when it carries them, as the reference does.
 */
export async function userForClaims(pool: pg.Pool, claims: VerifiedClaims): Promise<Principal> {
  const client = await pool.connect();
  try {
    const found = await client.query<{ id: string; email: string; name: string; role: string; email_verified: boolean }>(
      `select id, email, name, role, email_verified from "user" where id = $1`,
      [claims.sub],
    );
    let user = found.rows[0];
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
        // Two first requests at once: the second waits here and finds the user.
        await client.query("select pg_advisory_xact_lock(hashtext($1))", [claims.sub]);
        const again = await client.query<{ id: string; email: string; name: string; role: string; email_verified: boolean }>(
          `select id, email, name, role, email_verified from "user" where id = $1`,
          [claims.sub],
        );
        user = again.rows[0];
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
    return { kind: "jwt", userId: user.id, email: user.email, systemRole: user.role };
  } finally {
    client.release();
  }
}
