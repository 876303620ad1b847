import { Migration } from "@mikro-orm/migrations";

/**
 * Deleted users' subjects. A user row goes when the user is deleted; this row stays, so a token
 * issued before the deletion (by the built-in issuer or an external one) is refused instead of
 * re-creating the user on its next call. Kept forever: one small row per deleted user.
 */
export class Migration0022DeletedUsers extends Migration {
  override name = "0022-deleted-users";

  override up(): void {
    this.addSql(`create table "deleted_user" (
      "id" varchar(255) primary key,
      "deleted_at" timestamptz not null default now(),
      "deleted_by" varchar(255) null)`);
  }
}
