import { Migration } from "@mikro-orm/migrations";

export class Migration0002Sandboxes extends Migration {
  override name = "0002-sandboxes";

  override up(): void {
    this.addSql(`create table "sandbox" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "name" varchar(255) not null,
      "snapshot" varchar(255) null,
      "os_user" varchar(32) not null,
      "env" jsonb not null default '{}',
      "labels" jsonb not null default '{}',
      "public" boolean not null default false,
      "cpu" integer not null,
      "gpu" integer not null default 0,
      "memory" integer not null,
      "disk" integer not null,
      "state" varchar(32) not null default 'unknown',
      "desired_state" varchar(32) not null default 'started',
      "error_reason" text null,
      "backup_state" varchar(32) not null default 'None',
      "backup_created_at" timestamptz null,
      "auto_stop_interval" integer not null default 15,
      "auto_archive_interval" integer not null default 10080,
      "auto_delete_interval" integer not null default -1,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now(),
      "last_activity_at" timestamptz null,
      "auth_token" varchar(64) not null,
      "runner_id" varchar(64) null,
      unique ("organization_id", "name"))`);
    this.addSql(`create index "sandbox_org_state_idx" on "sandbox" ("organization_id", "state")`);
    this.addSql(`create index "sandbox_runner_state_idx" on "sandbox" ("runner_id", "state")`);
    this.addSql(`create index "sandbox_labels_idx" on "sandbox" using gin ("labels" jsonb_path_ops)`);
  }
}
