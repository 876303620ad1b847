import { Migration } from "@mikro-orm/migrations";

export class Migration0001Identity extends Migration {
  override name = "0001-identity";

  override up(): void {
    this.addSql(`create table "user" (
      "id" varchar(255) primary key,
      "name" varchar(255) not null,
      "email" varchar(255) not null default '',
      "role" varchar(32) not null default 'user',
      "created_at" timestamptz not null default now())`);
    this.addSql(`create table "organization" (
      "id" uuid primary key,
      "name" varchar(255) not null,
      "personal" boolean not null default false,
      "created_by" varchar(255) not null,
      "managed_api_keys" boolean not null default false,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now())`);
    this.addSql(`create table "organization_member" (
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "user_id" varchar(255) not null references "user" ("id") on delete cascade,
      "role" varchar(32) not null,
      "created_at" timestamptz not null default now(),
      primary key ("organization_id", "user_id"))`);
    this.addSql(`create table "api_key" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "user_id" varchar(255) not null references "user" ("id") on delete cascade,
      "name" varchar(255) not null,
      "key_hash" char(64) not null unique,
      "key_prefix" varchar(8) not null,
      "key_suffix" varchar(8) not null,
      "permissions" text[] not null default '{}',
      "created_by_key_hash" char(64) null,
      "created_at" timestamptz not null default now(),
      "last_used_at" timestamptz null,
      "expires_at" timestamptz null,
      unique ("organization_id", "user_id", "name"))`);
    this.addSql(`create index "api_key_created_by_idx" on "api_key" ("created_by_key_hash")`);
  }
}
