import { Migration } from "@mikro-orm/migrations";

/**
 * A sandbox's network policy (networkBlockAll, networkAllowList). Sandboxes made before had
 * loopback only: they keep it.
 */
export class Migration0014SandboxNetwork extends Migration {
  override name = "0014-sandbox-network";

  override up(): void {
    this.addSql(`alter table "sandbox"
      add column "network_block_all" boolean not null default true,
      add column "network_allow_list" text null`);
  }
}
