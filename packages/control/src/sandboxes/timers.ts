import type { SandboxRecord } from "../db/entities.ts";
import { Periodic } from "../server/periodic.ts";
import { archiveChecked, deleteChecked, driveDestroy } from "./archive-delete.ts";
import type { OperationContext, Outcome } from "./operation-context.ts";
import { pauseChecked } from "./pause-resume.ts";
import { stopChecked } from "./start-stop.ts";
import { isEphemeral, normalizeAutoArchive } from "./states.ts";

// Auto-stop, auto-pause, auto-archive and auto-delete (reference §4.4), the TTL's delete (autoDestroyAt), stopping the sandboxes of an
// organization suspended for longer than its grace period, plus two chores: finishing deletes
// that failed on the host, and reporting started sandboxes whose first process died. Everything
// the timers need is in the database (intervals, last activity), so they carry on across
// restarts; a pass runs every `tickMs` and acts through the sandboxes' locked operations.
// Intervals are minutes; `minuteMs` lets tests shrink a minute.

export interface TimerOptions {
  minuteMs: number;
  tickMs: number;
  log?: (line: string) => void;
}

/** Destroyed rows are kept a day (in timer minutes), then removed. */
const KEEP_DESTROYED_MINUTES = 24 * 60;

export class SandboxTimers {
  readonly #c: OperationContext;
  readonly #o: TimerOptions;
  readonly #loop: Periodic;

  constructor(c: OperationContext, o: TimerOptions) {
    this.#c = c;
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
    const m = this.#c;
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
      (r.state === "started" && r.desiredState === "started" && ((r.autoStopInterval > 0 && idleMinutes(r, r.autoStopInterval)) || suspended.has(r.organizationId))) ||
      (r.state === "paused" && r.desiredState === "paused" && suspended.has(r.organizationId)); // a paused sandbox keeps its state until stopped by hand
    // Auto-pause measures the same inactivity as auto-stop (the two are exclusive per sandbox).
    const shouldPause = (r: SandboxRecord) => r.state === "started" && r.desiredState === "started" && r.autoPauseInterval > 0 && idleMinutes(r, r.autoPauseInterval) && !suspended.has(r.organizationId);
    const shouldDelete = (r: SandboxRecord) =>
      (r.state === "stopped" || r.state === "archived") && r.desiredState === r.state && r.autoDeleteInterval >= 0 && idleMinutes(r, r.autoDeleteInterval);
    const shouldArchive = (r: SandboxRecord) =>
      r.state === "stopped" && r.desiredState === "stopped" && !isEphemeral(r.autoDeleteInterval) && idleMinutes(r, normalizeAutoArchive(r.autoArchiveInterval)) && !shouldDelete(r);

    // A TTL (setTtl) deletes at its time whatever the sandbox's state or activity.
    const ttlDue = (r: SandboxRecord) => !!r.autoDestroyAt && r.autoDestroyAt.getTime() <= now && r.desiredState !== "destroyed" && r.state !== "destroyed";
    const ops: Array<Promise<unknown> | undefined> = [];
    const expired = await m.store.pastAutoDestroy(new Date(now));
    for (const r of expired) if (!m.locks.busy(r.id)) ops.push(timerOp(m, r.id, () => deleteChecked(m, r.id, ttlDue)));
    const due = new Set(expired.map((r) => r.id));
    for (const r of [...rows, ...archived]) {
      if (m.locks.busy(r.id) || due.has(r.id)) continue;
      if (r.desiredState === "destroyed" && r.state === "error") ops.push(retryDestroy(m, r.id));
      else if (r.state === "started" && r.desiredState === "started" && host.get(r.id)?.state !== "started") {
        ops.push(markLost(m, r.id, "the sandbox is gone from its host"));
      } else if (shouldStop(r)) ops.push(timerOp(m, r.id, () => stopChecked(m, r.id, false, shouldStop)));
      else if (shouldPause(r)) ops.push(timerOp(m, r.id, () => pauseChecked(m, r.id, shouldPause)));
      else if (shouldDelete(r)) ops.push(timerOp(m, r.id, () => deleteChecked(m, r.id, shouldDelete)));
      else if (shouldArchive(r)) ops.push(timerOp(m, r.id, () => archiveChecked(m, r.id, shouldArchive)));
    }
    await Promise.allSettled(ops);
    await m.store.purgeDestroyed(new Date(now - KEEP_DESTROYED_MINUTES * minute));
  }
}

/** A started sandbox whose first process is gone (an OOM kill, a crash) is reported as `error`. */
export function markLost(c: OperationContext, id: string, reason: string): Promise<Outcome> | undefined {
  return timerOp(c, id, async () => {
    const cur = await c.current(id);
    if (cur.state !== "started" || cur.desiredState !== "started") return {};
    const rt = await (await c.runtimeOf(cur)).inspect(id);
    if (rt?.state === "started") return {};
    // Still on its host with its files (its first process died, its agent gave up): recoverable.
    return c.fail(id, new Error(rt?.error ?? reason), rt?.state === "error");
  });
}

/** Finishes a delete that failed on the host (the row is `error` with desired `destroyed`). */
function retryDestroy(c: OperationContext, id: string): Promise<Outcome> | undefined {
  return timerOp(c, id, async () => {
    const cur = await c.current(id);
    if (cur.desiredState !== "destroyed" || cur.state === "destroyed") return {};
    return driveDestroy(c, cur);
  });
}

/** The timers' operations: skipped when busy or closing; their reason (`when`) is re-checked under the lock. */
function timerOp(c: OperationContext, id: string, fn: () => Promise<Outcome>): Promise<Outcome> | undefined {
  if (c.closing) return undefined;
  const op = c.locks.tryRun(id, fn);
  op?.catch(() => undefined);
  return op;
}
