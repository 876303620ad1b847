import type { SandboxRecord } from "../db/entities.ts";
import type { SandboxManager } from "./manager.ts";
import { Periodic } from "../server/periodic.ts";
import { isEphemeral, normalizeAutoArchive } from "./states.ts";

// Auto-stop, auto-archive and auto-delete (reference §4.4), stopping the sandboxes of an
// organization suspended for longer than its grace period, plus two chores: finishing deletes
// that failed on the host, and reporting started sandboxes whose first process died. Everything
// the timers need is in the database (intervals, last activity), so they carry on across
// restarts; a pass runs every `tickMs` and acts through the manager's locked operations.
// Intervals are minutes; `minuteMs` lets tests shrink a minute.

export interface TimerOptions {
  minuteMs: number;
  tickMs: number;
  log?: (line: string) => void;
}

/** Destroyed rows are kept a day (in timer minutes), then removed. */
const KEEP_DESTROYED_MINUTES = 24 * 60;

export class SandboxTimers {
  readonly #manager: SandboxManager;
  readonly #o: TimerOptions;
  readonly #loop: Periodic;

  constructor(manager: SandboxManager, o: TimerOptions) {
    this.#manager = manager;
    this.#o = o;
    this.#loop = new Periodic(() => this.tick(), o.tickMs, (err) => o.log?.(`sandbox timers: ${String(err)}`));
  }

  start(): void {
    this.#loop.start();
  }

  /** Stops the loop and waits for a pass in progress. */
  stop(): Promise<void> {
    return this.#loop.stop();
  }

  /** One pass over the sandboxes of this server's runtime and of the registered runners that answer (and the archived ones, which no runner holds). */
  async tick(now = Date.now()): Promise<void> {
    const m = this.#manager;
    const rows = await m.store.ofRunner(m.runtime.runnerId);
    const archived = await m.store.archivedWithAutoDelete();
    const host = new Map((await m.runtime.list()).map((s) => [s.id, s]));
    for (const key of (await m.runners?.ready()) ?? []) {
      if (key === m.runtime.runnerId) continue;
      // A runner that fails to answer now is skipped this pass: its sandboxes are not "lost".
      const held = await m
        .runtimeOf({ id: key, runnerId: key })
        .then((rt) => rt.list())
        .catch(() => undefined);
      if (!held) continue;
      for (const s of held) host.set(s.id, s);
      rows.push(...(await m.store.ofRunner(key)).filter((r) => r.runnerId === key));
    }
    const suspended = await m.store.suspendedPastGrace(new Date(now), this.#o.minuteMs);
    const minute = this.#o.minuteMs;
    const idleFor = (r: SandboxRecord) => now - (r.lastActivityAt ?? r.updatedAt).getTime();
    const idleMinutes = (r: SandboxRecord, minutes: number) => idleFor(r) >= minutes * minute;

    const shouldStop = (r: SandboxRecord) =>
      r.state === "started" && r.desiredState === "started" && ((r.autoStopInterval > 0 && idleMinutes(r, r.autoStopInterval)) || suspended.has(r.organizationId));
    const shouldDelete = (r: SandboxRecord) =>
      (r.state === "stopped" || r.state === "archived") && r.desiredState === r.state && r.autoDeleteInterval >= 0 && idleMinutes(r, r.autoDeleteInterval);
    const shouldArchive = (r: SandboxRecord) =>
      r.state === "stopped" && r.desiredState === "stopped" && !isEphemeral(r.autoDeleteInterval) && idleMinutes(r, normalizeAutoArchive(r.autoArchiveInterval)) && !shouldDelete(r);

    const ops: Array<Promise<unknown> | undefined> = [];
    for (const r of [...rows, ...archived]) {
      if (m.locks.busy(r.id)) continue;
      if (r.desiredState === "destroyed" && r.state === "error") ops.push(m.retryDestroy(r.id));
      else if (r.state === "started" && r.desiredState === "started" && host.get(r.id)?.state !== "started") {
        ops.push(m.markLost(r.id, "the sandbox is gone from its host"));
      } else if (shouldStop(r)) ops.push(m.autoStop(r.id, shouldStop));
      else if (shouldDelete(r)) ops.push(m.autoDelete(r.id, shouldDelete));
      else if (shouldArchive(r)) ops.push(m.autoArchive(r.id, shouldArchive));
    }
    await Promise.allSettled(ops);
    await m.store.purgeDestroyed(new Date(now - KEEP_DESTROYED_MINUTES * minute));
  }
}
