import { Migration } from "@mikro-orm/migrations";

/**
 * Rate-limit counters shared by the control processes of one database (SANDBAR_RATE_LIMIT_STORE
 * postgres): the table rate-limiter-flexible's PostgreSQL store reads and writes, made here so
 * that processes starting together do not race to create it. Unlogged: counters are worth a
 * minute and need no crash safety.
 */
export class Migration0007RateLimits extends Migration {
  override name = "0007-rate-limits";

  override up(): void {
    this.addSql(`create unlogged table "rate_limit" (
      "key" varchar(255) primary key,
      "points" integer not null default 0,
      "expire" bigint null
    )`);
  }
}
