import { Migration } from "@mikro-orm/migrations";

/**
 * Captured layers (DESIGN.md decision 19): a sandbox's stack of read-only layers above its image
 * (a fork's, or one made from a running sandbox's snapshot) and the sandbox it was forked from;
 * a snapshot of a running sandbox names its layers and the runner holding them.
 */
export class Migration0025Layers extends Migration {
  override name = "0025-layers";

  override up(): void {
    this.addSql(`alter table "sandbox" add column "layers" jsonb null, add column "parent_id" uuid null;`);
    this.addSql(`create index "sandbox_parent_id_index" on "sandbox" ("parent_id") where "parent_id" is not null;`);
    this.addSql(`alter table "snapshot" add column "layers" jsonb null, add column "runner_id" varchar(255) null;`);
  }

  override down(): void {
    this.addSql(`alter table "snapshot" drop column "layers", drop column "runner_id";`);
    this.addSql(`drop index "sandbox_parent_id_index";`);
    this.addSql(`alter table "sandbox" drop column "layers", drop column "parent_id";`);
  }
}
