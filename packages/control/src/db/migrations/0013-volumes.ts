import { Migration } from "@mikro-orm/migrations";

/**
 * Volumes (spec 4.8): an organization's persistent storage, and the mounts a sandbox keeps in its
 * row (so stop, start, archive and restore find them again). A name is unique among the
 * organization's volumes that are not deleted (deleted ones are renamed `<name>-deleted`).
 */
export class Migration0013Volumes extends Migration {
  override name = "0013-volumes";

  override up(): void {
    this.addSql(`create table "volume" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "name" varchar(255) not null,
      "state" varchar(32) not null,
      "error_reason" text null,
      "created_at" timestamptz(3) not null,
      "updated_at" timestamptz(3) not null,
      "last_used_at" timestamptz(3) null)`);
    this.addSql(`create unique index "volume_organization_name_unique" on "volume" ("organization_id", "name") where "state" <> 'deleted'`);
    this.addSql(`alter table "sandbox" add column "volumes" jsonb not null default '[]'`);
  }
}
