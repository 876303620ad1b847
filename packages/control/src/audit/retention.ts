import type { MikroORM } from "@mikro-orm/postgresql";
import { Periodic } from "../server/periodic.ts";

// The audit log's chores, in the sandbox timers' style (a pass every `tickMs`, unref'd, stopped
// by waiting for the pass in progress): entries a crash left without an outcome get status 0
// after 30 minutes (as the reference), and with a retention period older entries are deleted.
// Both are single indexed statements, so several control processes may run them side by side.

export interface RetentionOptions {
  /** Unset: entries are kept forever. */
  retentionDays?: number;
  /** Length of a timer minute (the pending timeout is 30 of them); tests shrink it. */
  minuteMs: number;
  tickMs: number;
  log?: (line: string) => void;
}

/** How long a call may run before its entry counts as abandoned (reference: 30 minutes). */
const PENDING_MINUTES = 30;
const DAY_MS = 24 * 3600_000;

export class AuditRetention {
  readonly #orm: MikroORM;
  readonly #o: RetentionOptions;
  readonly #loop: Periodic;

  constructor(orm: MikroORM, o: RetentionOptions) {
    this.#orm = orm;
    this.#o = o;
    this.#loop = new Periodic(() => this.tick(), o.tickMs, (err) => o.log?.(`audit retention: ${String(err)}`));
  }

  start(): void {
    this.#loop.start();
  }

  stop(): Promise<void> {
    return this.#loop.stop();
  }

  /** One pass: closes abandoned entries, deletes expired ones; returns how many of each. */
  async tick(now = Date.now()): Promise<{ abandoned: number; deleted: number }> {
    const db = this.#orm.em.getConnection();
    const abandoned = await db.execute<{ affectedRows: number }>(
      `update "audit_log" set "status_code" = 0 where "status_code" is null and "created_at" < ?`,
      [new Date(now - PENDING_MINUTES * this.#o.minuteMs)],
      "run",
    );
    let deleted = 0;
    if (this.#o.retentionDays !== undefined) {
      const res = await db.execute<{ affectedRows: number }>(`delete from "audit_log" where "created_at" < ?`, [new Date(now - this.#o.retentionDays * DAY_MS)], "run");
      deleted = res.affectedRows;
    }
    return { abandoned: abandoned.affectedRows, deleted };
  }
}
