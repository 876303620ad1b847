import { Migration } from "@mikro-orm/migrations";

/**
 * Organizations' warm pools (the WarmPoolService): `pool` sandboxes of one snapshot and shape kept
 * started in a region, one pool per snapshot and region. The pool's sandboxes have no rows until a
 * create claims one; the claimed sandbox names its pool in warm_pool_id.
 */
export class Migration0027WarmPools extends Migration {
  override name = "0027-warm-pools";

  override up(): void {
    this.addSql(`create table "warm_pool" (
      "id" uuid not null primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "snapshot" varchar(255) not null,
      "image_ref" varchar(255) null,
      "layers" jsonb null,
      "region_id" varchar(255) not null,
      "pool" int not null,
      "cpu" int not null,
      "mem" int not null,
      "disk" int not null,
      "os_user" varchar(64) not null,
      "env" jsonb not null default '{}',
      "paused" boolean not null default false,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now(),
      unique ("organization_id", "snapshot", "region_id"))`);
    this.addSql(`alter table "sandbox" add column "warm_pool_id" uuid null;`);
  }

  override down(): void {
    this.addSql(`alter table "sandbox" drop column "warm_pool_id";`);
    this.addSql(`drop table "warm_pool";`);
  }
}
