import { Migration } from "@mikro-orm/migrations";

/** Totals of the operator's own organization: bounded by the host, not by a tier. */
export const OPERATOR_QUOTA = 100_000;

/** The region every sandbox of a one-host installation runs in; shared by all organizations. */
export const LOCAL_REGION_ID = "local";

/**
 * Organizations as the reference has them: quotas, rate-limit overrides, suspension, telemetry and
 * experimental config; regions with per-organization region quotas; roles assigned to members and
 * invitations; the region each sandbox runs in.
 */
export class Migration0006Organizations extends Migration {
  override name = "0006-organizations";

  override up(): void {
    this.addSql(`create table "region" (
      "id" varchar(255) primary key,
      "name" varchar(255) not null unique,
      "organization_id" uuid null references "organization" ("id") on delete cascade,
      "region_type" varchar(16) not null,
      "enforce_quotas" boolean not null default false,
      "proxy_url" text null,
      "ssh_gateway_url" text null,
      "snapshot_manager_url" text null,
      "proxy_api_key_hash" char(64) null,
      "ssh_gateway_api_key_hash" char(64) null,
      "snapshot_manager_password_hash" char(64) null,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now())`);
    this.addSql(`insert into "region" (id, name, region_type, enforce_quotas) values ('${LOCAL_REGION_ID}', '${LOCAL_REGION_ID}', 'shared', true)`);

    this.addSql(`alter table "organization"
      add column "default_region_id" varchar(255) null references "region" ("id"),
      add column "max_cpu_per_sandbox" integer not null default 4,
      add column "max_memory_per_sandbox" integer not null default 8,
      add column "max_disk_per_sandbox" integer not null default 10,
      add column "max_snapshot_size" integer not null default 20,
      add column "snapshot_quota" integer not null default 30,
      add column "volume_quota" integer not null default 100,
      add column "authenticated_rate_limit" integer null,
      add column "sandbox_create_rate_limit" integer null,
      add column "sandbox_lifecycle_rate_limit" integer null,
      add column "authenticated_rate_limit_ttl_seconds" integer null,
      add column "sandbox_create_rate_limit_ttl_seconds" integer null,
      add column "sandbox_lifecycle_rate_limit_ttl_seconds" integer null,
      add column "suspended" boolean not null default false,
      add column "suspended_at" timestamptz null,
      add column "suspension_reason" text null,
      add column "suspended_until" timestamptz null,
      add column "suspension_cleanup_grace_period_hours" integer not null default 24,
      add column "snapshot_deactivation_timeout_minutes" integer not null default 20160,
      add column "sandbox_limited_network_egress" boolean not null default false,
      add column "experimental_config" jsonb null,
      add column "otel_config" jsonb null`);

    // Totals per organization, region and sandbox class; the per-sandbox maxima fall back to the organization's.
    this.addSql(`create table "region_quota" (
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "region_id" varchar(255) not null references "region" ("id") on delete cascade,
      "sandbox_class" varchar(32) not null default 'container',
      "total_cpu_quota" integer not null default 10,
      "total_memory_quota" integer not null default 10,
      "total_disk_quota" integer not null default 30,
      "total_gpu_quota" integer not null default 0,
      "max_cpu_per_sandbox" integer null,
      "max_memory_per_sandbox" integer null,
      "max_disk_per_sandbox" integer null,
      primary key ("organization_id", "region_id", "sandbox_class"))`);
    // Organizations made before regions existed live in the local region with the default quota,
    // except the operator's (which created the keys of every test and benchmark so far).
    this.addSql(`update "organization" set default_region_id = '${LOCAL_REGION_ID}'`);
    this.addSql(`insert into "region_quota" (organization_id, region_id) select id, '${LOCAL_REGION_ID}' from "organization"`);
    this.addSql(`update "region_quota" set total_cpu_quota = ${OPERATOR_QUOTA}, total_memory_quota = ${OPERATOR_QUOTA}, total_disk_quota = ${OPERATOR_QUOTA}
      where organization_id in (select id from "organization" where created_by = 'sandbar-admin' and not personal)`);

    this.addSql(`create table "organization_role" (
      "id" uuid primary key,
      "organization_id" uuid null references "organization" ("id") on delete cascade,
      "name" varchar(255) not null,
      "description" text not null default '',
      "permissions" text[] not null,
      "is_global" boolean not null default false,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now())`);
    for (const [n, name, description, permissions] of GLOBAL_ROLES) {
      this.addSql(
        `insert into "organization_role" (id, name, description, permissions, is_global, created_at, updated_at)
         values ('00000000-0000-0000-0000-00000000000${n}', '${name}', '${description}', '{${permissions.join(",")}}', true, 'epoch', 'epoch')`,
      );
    }
    // Roles in use cannot be deleted (no cascade from the role side): the service answers 409 first.
    this.addSql(`create table "organization_member_role" (
      "organization_id" uuid not null,
      "user_id" varchar(255) not null,
      "role_id" uuid not null references "organization_role" ("id"),
      primary key ("organization_id", "user_id", "role_id"),
      foreign key ("organization_id", "user_id") references "organization_member" ("organization_id", "user_id") on delete cascade)`);
    this.addSql(`alter table "organization_member" add column "updated_at" timestamptz not null default now()`);

    this.addSql(`create table "organization_invitation" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "email" varchar(255) not null,
      "invited_by" varchar(255) not null,
      "role" varchar(32) not null,
      "status" varchar(32) not null default 'pending',
      "expires_at" timestamptz not null,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now())`);
    this.addSql(`create index "organization_invitation_email_idx" on "organization_invitation" ("email", "status")`);
    this.addSql(`create table "organization_invitation_role" (
      "invitation_id" uuid not null references "organization_invitation" ("id") on delete cascade,
      "role_id" uuid not null references "organization_role" ("id"),
      primary key ("invitation_id", "role_id"))`);

    this.addSql(`alter table "sandbox" add column "region_id" varchar(255) not null default '${LOCAL_REGION_ID}' references "region" ("id")`);
    this.addSql(`create index "sandbox_auth_token_idx" on "sandbox" ("auth_token")`);
  }
}

const ALL = [
  "write:registries", "delete:registries", "write:snapshots", "delete:snapshots", "write:sandboxes", "delete:sandboxes",
  "read:volumes", "write:volumes", "delete:volumes", "write:regions", "delete:regions", "read:runners", "write:runners",
  "delete:runners", "read:audit_logs",
];

/** The reference's seeded global roles, with its fixed ids. */
const GLOBAL_ROLES: Array<[number, string, string, string[]]> = [
  [1, "Developer", "Grants the ability to create sandboxes and keys in the organization", ["write:sandboxes"]],
  [2, "Sandboxes Admin", "Grants admin access to sandboxes in the organization", ["write:sandboxes", "delete:sandboxes"]],
  [3, "Snapshots Admin", "Grants admin access to snapshots in the organization", ["write:snapshots", "delete:snapshots"]],
  [4, "Registries Admin", "Grants admin access to registries in the organization", ["write:registries", "delete:registries"]],
  [5, "Super Admin", "Grants full access to all resources in the organization", ALL],
  [6, "Volumes Admin", "Grants admin access to volumes in the organization", ["read:volumes", "write:volumes", "delete:volumes"]],
  [7, "Auditor", "Grants access to audit logs in the organization", ["read:audit_logs"]],
  [8, "Infrastructure Admin", "Grants admin access to infrastructure in the organization", ["write:regions", "delete:regions", "read:runners", "write:runners", "delete:runners"]],
];
