import { Migration } from "@mikro-orm/migrations";

/**
 * Snapshots that travel (DESIGN.md decision 19): a running sandbox's snapshot exported as an OCI
 * image to the internal registry, by name pinned to its manifest digest, so runners without its
 * captured layers pull it; or why the export failed (the snapshot stays usable where its layers are).
 */
export class Migration0028SnapshotImages extends Migration {
  override name = "0028-snapshot-images";

  override up(): void {
    this.addSql(`alter table "snapshot" add column "pushed_image" varchar(512) null, add column "push_error" text null;`);
  }

  override down(): void {
    this.addSql(`alter table "snapshot" drop column "pushed_image", drop column "push_error";`);
  }
}
