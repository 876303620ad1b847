import type { SandboxRecord } from "../db/entities.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import { isErrored } from "./states.ts";

// Pause (DESIGN.md decision 20: the cgroup freezer plus memory reclaim, no memory image) and
// resume, with the reference 0.218's states: started + desired paused reads `pausing`, paused +
// desired started `resuming`. Resume is start's job for a paused sandbox, and every way to its
// agent (toolbox, preview, terminal) resumes it first: callers of one sandbox share one resume.
// A paused sandbox holds its disk but no cpu or memory of the quota (organizations/usage.ts counts
// those for rows started or going there).

export async function pause(c: OperationContext, organizationId: string, idOrName: string): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  if (row.state === "paused" && row.desiredState === "paused") return row; // idempotent
  if (isErrored(row.state)) throw bad("Sandbox is in an errored state");
  const op = c.operate(row.id, () => pauseChecked(c, row.id));
  return c.answer(row.id, op, "Sandbox failed to pause");
}

/** Pause with the preconditions checked under the lock; `when` lets a timer re-check its reason. */
export async function pauseChecked(c: OperationContext, id: string, when?: (row: SandboxRecord) => boolean): Promise<Outcome> {
  const cur = await c.current(id);
  if (when && !when(cur)) return {};
  if (cur.state === "paused" && cur.desiredState === "paused") return { row: cur };
  if (cur.state !== cur.desiredState) throw stateChangeInProgress();
  if (cur.state !== "started") throw bad("Sandbox must be in started state to pause");
  await c.runtimeOf(cur);
  await c.store.update(id, { desiredState: "paused" });
  return drivePause(c, cur);
}

/**
 * Freezes the sandbox on its host. A failure leaves it running (the reference rolls back to
 * `started`): thawed again in case the freeze half took, the reason answered.
 */
export async function drivePause(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  const rt = await c.runtimeOf(row);
  try {
    await rt.pause(row.id);
    return { row: await c.store.update(row.id, { state: "paused" }) };
  } catch (err) {
    const reason = reasonOf(err);
    c.log(`sandbox ${row.id}: pause failed: ${reason}`);
    await rt.resume(row.id).catch(() => undefined);
    await c.store.update(row.id, { state: "started", desiredState: "started" });
    return { failed: reason };
  }
}

/** Thaws the sandbox on its host; it is `started` again, with an activity stamp. */
export async function driveResume(c: OperationContext, row: SandboxRecord): Promise<Outcome> {
  try {
    await (await c.runtimeOf(row)).resume(row.id);
    const done = await c.store.update(row.id, { state: "started", errorReason: null, lastActivityAt: new Date() });
    c.activity.stamped(row.id);
    return { row: done };
  } catch (err) {
    return c.fail(row.id, err);
  }
}

/** Resumes in flight, per context: every caller of one sandbox waits for the same one. */
const resuming = new WeakMap<OperationContext, Map<string, Promise<Outcome>>>();

/**
 * Resumes a paused sandbox (start's path for one, and auto-resume's): the quota admits its cpu
 * and memory again (its disk it holds already); the preview token is kept, as the reference
 * keeps it on a resume. Concurrent callers share one operation.
 */
export function resume(c: OperationContext, id: string): Promise<Outcome> {
  let inFlight = resuming.get(c);
  if (!inFlight) resuming.set(c, (inFlight = new Map()));
  const running = inFlight.get(id);
  if (running) return running;
  const op = c.operate(id, async () => {
    const cur = await c.current(id);
    if (cur.state === "started" && cur.desiredState === "started") return { row: cur };
    if (cur.state !== "paused") throw bad("Sandbox is not in valid state");
    if (cur.desiredState !== "paused" && cur.desiredState !== "started") throw stateChangeInProgress();
    await c.runtimeOf(cur);
    await c.store.updateAdmitted(cur, { ...cur, disk: 0 }, { desiredState: "started" });
    return driveResume(c, cur);
  });
  // Settled with the lock let go: a caller that goes on to the agent must not find it held.
  const done = op.then(async (outcome) => {
    await c.locks.released(id);
    return outcome;
  });
  inFlight.set(id, done);
  const forget = () => inFlight.delete(id);
  done.then(forget, forget);
  return done;
}

/**
 * Auto-resume for a caller of the sandbox's agent (toolbox, preview, terminal): a paused
 * sandbox is resumed and the caller waits; one already resuming is waited for. Answers the row
 * as it is afterwards (unchanged when it was neither paused nor resuming).
 */
export async function resumedForCall(c: OperationContext, row: SandboxRecord): Promise<SandboxRecord> {
  if (row.state === "started" && row.desiredState === "paused" && c.locks.busy(row.id)) {
    // Being paused (the auto-pause timer, another caller): that pause ends first, then this resumes.
    await c.locks.released(row.id);
    return resumedForCall(c, await c.current(row.id));
  }
  const inFlight = resuming.get(c)?.get(row.id);
  // Read `started` while its resume still finishes (its lock held): waited for as well.
  if (row.state !== "paused" && !inFlight) return row;
  const op = inFlight ?? (row.desiredState === "paused" && !c.locks.busy(row.id) ? resume(c, row.id) : undefined);
  if (!op) throw stateChangeInProgress();
  const outcome = await op;
  if (outcome.failed !== undefined) throw bad(`Sandbox failed to resume: ${outcome.failed}`);
  return outcome.row ?? c.current(row.id);
}
