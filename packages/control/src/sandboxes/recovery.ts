import type { SandboxRecord } from "../db/entities.ts";
import type { OperationContext } from "./operation-context.ts";
import { HeldElsewhere } from "./operation-locks.ts";
import { resume } from "./reconcile.ts";

// Operations a control process started and never finished because it died (kill -9 between the
// row's insert and the sandbox's start, say): every control process looks, every tick, for
// sandboxes in the middle of an operation (state and desired state differ) on a runtime it
// reaches (its own, or a registered runner that answers; or none: an archived sandbox), and finishes each one whose operation
// no live process holds (the shared locks of cluster-locks.ts: a dead process's are released by
// PostgreSQL). Finishing is what a restart's reconciliation does (reconcile.ts): a create is made
// again from scratch on its runner (what the dead one left there is removed first), a delete or
// stop carried through. Whichever process takes the lock first acts; the others skip it.

const STABLE_ERRORS = ["error", "build_failed", "destroyed"];
/** States that are a transition whatever the desired state says. */
const PASSING = ["unknown", "resizing", "restoring", "pending_build", "building_snapshot"];

const isInterrupted = (r: Pick<SandboxRecord, "state" | "desiredState">) =>
  !STABLE_ERRORS.includes(r.state) && (r.state !== r.desiredState || PASSING.includes(r.state));

export class InterruptedOperations {
  readonly #m: OperationContext;
  readonly #tickMs: number;
  readonly #log: (line: string) => void;
  #timer: NodeJS.Timeout | undefined;
  #pass: Promise<unknown> | undefined;
  #stopped = false;

  constructor(m: OperationContext, o: { tickMs: number; log?: (line: string) => void }) {
    this.#m = m;
    this.#tickMs = o.tickMs;
    this.#log = o.log ?? (() => undefined);
  }

  start(): void {
    const tick = () => {
      if (this.#stopped) return;
      this.#pass = this.pass()
        .catch((err: unknown) => this.#log(`recovery: ${err instanceof Error ? err.message : String(err)}`))
        .finally(() => {
          if (!this.#stopped) this.#timer = setTimeout(tick, this.#tickMs);
        });
    };
    this.#timer = setTimeout(tick, this.#tickMs);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#pass;
  }

  /** One look: the ids of the sandboxes whose interrupted operation this process finished (or ended in `error`). */
  async pass(): Promise<string[]> {
    const m = this.#m;
    const runnerIds = [m.runtime.runnerId, ...((await m.runners?.ready()) ?? [])];
    const rows = (await m.store.list({ where: `("runner_id" in (${runnerIds.map(() => "?").join(", ")}) or "runner_id" is null) and "state" not in ('error', 'build_failed', 'destroyed')`, params: runnerIds, orderBy: `"created_at"` })).filter(isInterrupted);
    const done: string[] = [];
    for (const row of rows) {
      const op = m.locks.tryRun(row.id, async () => {
        // Under the lock: read again, it may have finished between the list and the lock.
        const cur = await m.store.byId(row.id);
        if (!cur || !isInterrupted(cur)) return false;
        const onHost = await (await m.runtimeOf(cur)).inspect(cur.id);
        this.#log(`recovery: sandbox ${cur.id} was left ${cur.state} (going ${cur.desiredState}) by a control process that is gone: finishing it`);
        await resume(m, cur, onHost?.state);
        return true;
      });
      if (!op) continue; // this process is working on it
      try {
        if (await op) done.push(row.id);
      } catch (err) {
        if (!(err instanceof HeldElsewhere)) this.#log(`recovery: sandbox ${row.id}: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    return done;
  }
}
