import type pg from "pg";
import { hashPassword } from "./passwords.ts";

/**
 * Sets (or replaces) a user's sign-in password for the built-in issuer; only its scrypt hash
 * is stored. Pass the client of the transaction that creates the user, if any.
 */
export async function setUserPassword(db: pg.Pool | pg.ClientBase, userId: string, password: string): Promise<void> {
  if (password.length < 8) throw new RangeError("password must be at least 8 characters");
  await db.query(
    `insert into user_password (user_id, password_hash) values ($1, $2)
     on conflict (user_id) do update set password_hash = excluded.password_hash, updated_at = now()`,
    [userId, await hashPassword(password)],
  );
}
