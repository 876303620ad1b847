import { Migration } from "@mikro-orm/migrations";

export class Migration0005Users extends Migration {
  override name = "0005-users";

  override up(): void {
    // Only the public half of a user's SSH key pair is kept: the private half is handed out once,
    // on create or regeneration, and never stored.
    this.addSql(`alter table "user" add column "email_verified" boolean not null default false`);
    this.addSql(`alter table "user" add column "ssh_public_key" text null`);
  }
}
