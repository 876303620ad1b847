import { Migration } from "@mikro-orm/migrations";

/** Sign-in: password credentials, the built-in issuer's signing keys and its storage. */
export class Migration0004Identity extends Migration {
  override name = "0004-identity";

  override up(): void {
    // scrypt hashes only; the login name is the e-mail or the user id.
    this.addSql(`create table "user_password" (
      "user_id" varchar(255) primary key references "user" ("id") on delete cascade,
      "password_hash" text not null,
      "updated_at" timestamptz not null default now())`);
    // Private signing keys (JWK). The newest signs; retired ones stay published until removed.
    this.addSql(`create table "oidc_signing_key" (
      "kid" varchar(64) primary key,
      "private_jwk" jsonb not null,
      "created_at" timestamptz not null default now(),
      "retired_at" timestamptz null)`);
    // Cookie-signing secrets shared by every control process.
    this.addSql(`create table "oidc_secret" (
      "name" varchar(64) primary key,
      "value" text not null,
      "created_at" timestamptz not null default now())`);
    // oidc-provider's models (sessions, codes, grants, refresh tokens...), one table for all kinds.
    this.addSql(`create table "oidc_payload" (
      "kind" varchar(64) not null,
      "id" varchar(255) not null,
      "payload" jsonb not null,
      "grant_id" varchar(255) null,
      "user_code" varchar(255) null,
      "uid" varchar(255) null,
      "expires_at" timestamptz null,
      "consumed_at" timestamptz null,
      primary key ("kind", "id"))`);
    this.addSql(`create index "oidc_payload_grant_idx" on "oidc_payload" ("grant_id")`);
    this.addSql(`create index "oidc_payload_uid_idx" on "oidc_payload" ("uid")`);
    this.addSql(`create index "oidc_payload_expires_idx" on "oidc_payload" ("expires_at")`);
  }
}
