import { Migration } from "@mikro-orm/migrations";

/**
 * Snapshots made from OCI images, per organization (names unique in one), and on each sandbox
 * the image it boots from (the manifest digest on this host's image store; null for the default
 * snapshot). General snapshots (organization_id null) are visible to every organization.
 */
export class Migration0011Snapshots extends Migration {
  override name = "0011-snapshots";

  override up(): void {
    this.addSql(`create table "snapshot" (
      "id" uuid primary key,
      "organization_id" uuid null references "organization" ("id") on delete cascade,
      "general" boolean not null default false,
      "name" varchar(255) not null,
      "image_name" text not null,
      "state" varchar(32) not null default 'pending',
      "error_reason" text null,
      "size" double precision null,
      "entrypoint" jsonb not null default '[]',
      "cpu" integer not null default 1,
      "gpu" integer not null default 0,
      "mem" integer not null default 1,
      "disk" integer not null default 3,
      "ref" varchar(80) null,
      "build_log" text not null default '',
      "created_at" timestamptz(3) not null default clock_timestamp(),
      "updated_at" timestamptz(3) not null default clock_timestamp(),
      "last_used_at" timestamptz(3) null)`);
    this.addSql(`create unique index "snapshot_organization_id_name_unique" on "snapshot" ("organization_id", "name")`);
    this.addSql(`create index "snapshot_state_index" on "snapshot" ("state")`);
    // The default snapshot, listed as the reference lists its general snapshot.
    this.addSql(`insert into "snapshot" ("id", "general", "name", "image_name", "state", "cpu", "mem", "disk")
      values ('00000000-0000-4000-8000-00000000d0d0', true, 'sandbar-default', 'sandbar-default', 'active', 1, 1, 3)`);
    this.addSql(`alter table "sandbox" add column "image_ref" varchar(80) null`);
  }
}
