import { Migration } from "@mikro-orm/migrations";

/**
 * A sandbox's class (the reference's SandboxClass: container, linux-vm, android, windows) and the
 * GPU type it was pinned to by placement: placement matches the class with its runner's (runner
 * sandbox_class, migration 0018) and counts GPUs like cpu and memory.
 */
export class Migration0021SandboxClassGpu extends Migration {
  override name = "0021-sandbox-class-gpu";

  override up(): void {
    this.addSql(`alter table "sandbox" add column "sandbox_class" varchar(16) not null default 'container', add column "gpu_type" varchar(64) null;`);
  }

  override down(): void {
    this.addSql(`alter table "sandbox" drop column "sandbox_class", drop column "gpu_type";`);
  }
}
