import { Migration } from "@mikro-orm/migrations";

/**
 * Signed preview URLs: the token is the credential, so only its SHA-256 is kept, with the port it
 * opens and when it stops working. Rows go with their sandbox.
 */
export class Migration0008Preview extends Migration {
  override name = "0008-preview";

  override up(): void {
    this.addSql(`create table "signed_preview_url" (
      "token_hash" char(64) primary key,
      "sandbox_id" uuid not null references "sandbox" ("id") on delete cascade,
      "port" integer not null,
      "expires_at" timestamptz not null,
      "created_at" timestamptz not null default now())`);
    this.addSql(`create index "signed_preview_url_expires_at_idx" on "signed_preview_url" ("expires_at")`);
  }
}
