import { Migration } from "@mikro-orm/migrations";

/**
 * A sandbox's auto-pause interval (the reference 0.218's autoPauseInterval): minutes of
 * inactivity before the timers pause a started sandbox; 0 disables. Paused sandboxes are rows in
 * state `paused` (desired `paused`), no column of their own.
 */
export class Migration0024AutoPause extends Migration {
  override name = "0024-auto-pause";

  override up(): void {
    this.addSql(`alter table "sandbox" add column "auto_pause_interval" int not null default 0;`);
  }

  override down(): void {
    this.addSql(`alter table "sandbox" drop column "auto_pause_interval";`);
  }
}
