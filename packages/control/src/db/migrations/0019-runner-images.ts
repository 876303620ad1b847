import { Migration } from "@mikro-orm/migrations";

/**
 * The images each runner holds (manifest digests, as its ListSnapshots answered at its last health
 * check, plus what it pulled since): placement prefers a runner that already holds a create's image.
 * Whether it mounts volumes from a shared volume root: sandboxes with volumes go only there.
 */
export class Migration0019RunnerImages extends Migration {
  override name = "0019-runner-images";

  override up(): void {
    this.addSql(`alter table "runner" add column "held_images" text[] not null default '{}', add column "shared_volumes" boolean not null default false;`);
  }

  override down(): void {
    this.addSql(`alter table "runner" drop column "held_images", drop column "shared_volumes";`);
  }
}
