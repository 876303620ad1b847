import { Migration } from "@mikro-orm/migrations";

/**
 * Changesets since a checkpoint (docs/changesets.md): a running sandbox's snapshot names the
 * sandbox it was taken of, so a changeset can tell whether the snapshot is in a sandbox's lineage.
 */
export class Migration0029Checkpoints extends Migration {
  override name = "0029-checkpoints";

  override up(): void {
    this.addSql(`alter table "snapshot" add column "sandbox_id" uuid null;`);
  }

  override down(): void {
    this.addSql(`alter table "snapshot" drop column "sandbox_id";`);
  }
}
