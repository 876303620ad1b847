import { Migration } from "@mikro-orm/migrations";

/**
 * Runners: the hosts an organization registers in its custom regions. Control reaches each at its
 * `api_url` with its credential (sealed with the SecretBox: control presents it, so a hash would
 * not do) and records what the runner last reported.
 */
export class Migration0018Runners extends Migration {
  override name = "0018-runners";

  override up(): void {
    this.addSql(`create table "runner" (
      "id" uuid primary key,
      "organization_id" uuid null references "organization" ("id") on delete cascade,
      "region_id" varchar(255) not null,
      "name" varchar(255) not null,
      "api_url" text null,
      "credential_sealed" text not null,
      "tags" jsonb not null default '[]',
      "sandbox_class" varchar(16) not null default 'container',
      "cpu" int not null default 0,
      "memory_gib" int not null default 0,
      "disk_gib" int not null default 0,
      "gpu" int null,
      "gpu_type" varchar(64) null,
      "cpu_usage" double precision not null default 0,
      "memory_usage" double precision not null default 0,
      "disk_usage" double precision not null default 0,
      "started_sandboxes" int not null default 0,
      "snapshot_count" int not null default 0,
      "runner_key" varchar(64) null,
      "app_version" varchar(64) null,
      "state" varchar(16) not null default 'initializing',
      "state_reason" text null,
      "unschedulable" boolean not null default false,
      "draining" boolean not null default false,
      "last_checked" timestamptz null,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now(),
      constraint "runner_region_name_unique" unique ("region_id", "name")
    )`);
    this.addSql(`create index "runner_organization_idx" on "runner" ("organization_id")`);
  }
}
