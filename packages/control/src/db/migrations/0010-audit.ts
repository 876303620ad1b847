import { Migration } from "@mikro-orm/migrations";

/**
 * The audit log (reference: account digest section 8): one row per state-changing call, written
 * before the call runs (status_code null) and completed with its outcome. Times are kept to the
 * millisecond so the list's cursor, (created_at, id), round-trips through JSON exactly.
 */
export class Migration0010Audit extends Migration {
  override name = "0010-audit";

  override up(): void {
    this.addSql(`create table "audit_log" (
      "id" uuid primary key,
      "actor_id" varchar(255) not null,
      "actor_email" varchar(255) not null default '',
      "actor_api_key_prefix" varchar(16) null,
      "actor_api_key_suffix" varchar(16) null,
      "organization_id" uuid null,
      "action" varchar(64) not null,
      "target_type" varchar(64) null,
      "target_id" varchar(1024) null,
      "status_code" integer null,
      "error_message" text null,
      "ip_address" varchar(64) null,
      "user_agent" text null,
      "source" varchar(255) null,
      "metadata" jsonb null,
      "created_at" timestamptz(3) not null default clock_timestamp())`);
    this.addSql(`create index "audit_log_created_at_index" on "audit_log" ("created_at", "id")`);
    this.addSql(`create index "audit_log_organization_id_created_at_index" on "audit_log" ("organization_id", "created_at", "id")`);
    // Rows a crash left without an outcome: found without scanning the log.
    this.addSql(`create index "audit_log_pending_index" on "audit_log" ("created_at") where "status_code" is null`);
  }
}
