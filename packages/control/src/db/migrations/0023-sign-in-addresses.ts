import { Migration } from "@mikro-orm/migrations";

/**
 * Where each user has signed in from at the built-in issuer's login page (an IPv4 address, or
 * an IPv6 /64): the right password from such a known-good address skips the sign-in slowdown
 * that strangers' failures put on the login (identity/login-throttle.ts). Rows not renewed by a
 * sign-in for 90 days are removed; a deleted user's go with the user.
 */
export class Migration0023SignInAddresses extends Migration {
  override name = "0023-sign-in-addresses";

  override up(): void {
    this.addSql(`create table "sign_in_address" (
      "user_id" varchar(255) not null references "user" ("id") on delete cascade,
      "address" varchar(64) not null,
      "last_sign_in_at" timestamptz not null default now(),
      primary key ("user_id", "address"))`);
    this.addSql(`create index "sign_in_address_last_idx" on "sign_in_address" ("last_sign_in_at")`);
  }
}
