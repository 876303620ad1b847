import { Migration } from "@mikro-orm/migrations";

/**
 * The 0.218 client's lifecycle additions: a TTL (`auto_destroy_at`, kept in the row so the timers
 * delete on time across restarts), whether an `error` can be left with recover (`recoverable`,
 * set when the sandbox failed in a way that left its files intact), and the key that signs its
 * file URLs (`signing_key_sealed`, sealed with the server's secret box; null until first asked for).
 */
export class Migration0026SandboxLifecycle extends Migration {
  override name = "0026-sandbox-lifecycle";

  override up(): void {
    this.addSql(`alter table "sandbox" add column "auto_destroy_at" timestamptz null`);
    this.addSql(`alter table "sandbox" add column "recoverable" boolean not null default false`);
    this.addSql(`alter table "sandbox" add column "signing_key_sealed" text null`);
    this.addSql(`create index "sandbox_auto_destroy_at_idx" on "sandbox" ("auto_destroy_at") where "auto_destroy_at" is not null`);
  }
}
