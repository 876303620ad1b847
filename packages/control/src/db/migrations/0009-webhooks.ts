import { Migration } from "@mikro-orm/migrations";

/**
 * Webhooks: an organization's endpoints (secrets sealed with the SecretBox), the transactional
 * outbox of events (one message per event, written in the transaction of the change that caused
 * it, with one delivery row per endpoint it goes to), and every delivery attempt.
 */
export class Migration0009Webhooks extends Migration {
  override name = "0009-webhooks";

  override up(): void {
    this.addSql(`create table "webhook_endpoint" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "url" text not null,
      "description" text not null default '',
      "event_types" text[] not null default '{}',
      "enabled" boolean not null default true,
      "disabled_reason" text null,
      "secret" text not null,
      "previous_secret" text null,
      "previous_secret_until" timestamptz null,
      "failing_since" timestamptz null,
      "created_at" timestamptz not null default now(),
      "updated_at" timestamptz not null default now())`);
    this.addSql(`create index "webhook_endpoint_organization_id_index" on "webhook_endpoint" ("organization_id")`);

    // The body is the exact JSON text sent, so every attempt of a message signs the same bytes.
    this.addSql(`create table "webhook_message" (
      "id" uuid primary key,
      "organization_id" uuid not null references "organization" ("id") on delete cascade,
      "event_type" varchar(64) not null,
      "body" text not null,
      "created_at" timestamptz not null default now())`);
    this.addSql(`create index "webhook_message_organization_id_index" on "webhook_message" ("organization_id")`);
    this.addSql(`create index "webhook_message_created_at_index" on "webhook_message" ("created_at")`);

    // The work queue: due rows are claimed with FOR UPDATE SKIP LOCKED; a claim pushes
    // next_attempt_at out by a lease, so a process that dies mid-delivery leaves the row due again.
    this.addSql(`create table "webhook_delivery" (
      "id" uuid primary key,
      "message_id" uuid not null references "webhook_message" ("id") on delete cascade,
      "endpoint_id" uuid not null references "webhook_endpoint" ("id") on delete cascade,
      "status" varchar(16) not null default 'pending',
      "attempts" integer not null default 0,
      "next_attempt_at" timestamptz not null default now(),
      "created_at" timestamptz not null default now(),
      unique ("message_id", "endpoint_id"))`);
    this.addSql(`create index "webhook_delivery_due_index" on "webhook_delivery" ("next_attempt_at") where "status" = 'pending'`);
    this.addSql(`create index "webhook_delivery_endpoint_id_index" on "webhook_delivery" ("endpoint_id")`);

    this.addSql(`create table "webhook_attempt" (
      "id" uuid primary key,
      "delivery_id" uuid not null references "webhook_delivery" ("id") on delete cascade,
      "endpoint_id" uuid not null references "webhook_endpoint" ("id") on delete cascade,
      "message_id" uuid not null,
      "event_type" varchar(64) not null,
      "attempt" integer not null,
      "status_code" integer null,
      "success" boolean not null,
      "duration_ms" integer not null,
      "error" text null,
      "response_body" text null,
      "next_attempt_at" timestamptz null,
      "created_at" timestamptz not null default now())`);
    this.addSql(`create index "webhook_attempt_endpoint_id_created_at_index" on "webhook_attempt" ("endpoint_id", "created_at" desc)`);
  }
}
