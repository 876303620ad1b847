import { Migration } from "@mikro-orm/migrations";

/**
 * Declarative builds: the build info (Dockerfile, context hashes, build ref) of a snapshot or
 * sandbox made from one. Null for everything else.
 */
export class Migration0016Builds extends Migration {
  override name = "0016-builds";

  override up(): void {
    this.addSql(`alter table "snapshot" add column "build_info" jsonb null`);
    this.addSql(`alter table "sandbox" add column "build_info" jsonb null`);
  }
}
