import type { MikroORM } from "@mikro-orm/postgresql";
import { execIn } from "../db/exec.ts";
import type { SandboxRuntime } from "../sandboxes/runtime.ts";

// Sandboxes a registered runner holds that the database does not claim for it (no row, a
// destroyed one, or one another runner holds now: e.g. a runner that was away while its sandboxes
// were deleted, or that comes back holding what a crash left). The health loop hands each ready
// runner's list here; what stays unclaimed for the grace period is destroyed. The grace counts
// from when this process first saw it unclaimed on a runner that answers (a runner that stops
// answering starts over), so a sandbox whose row is being written, or a runner just back, is
// left alone meanwhile. Archived rows are left to reconcile at control start (it checks the archive).

export class StraySweep {
  readonly #orm: MikroORM;
  readonly #graceMs: number;
  readonly #log: (line: string) => void;
  /** runner key -> sandbox id -> when it was first seen unclaimed. */
  readonly #seen = new Map<string, Map<string, number>>();

  constructor(orm: MikroORM, graceMs: number, log: (line: string) => void = () => undefined) {
    this.#orm = orm;
    this.#graceMs = graceMs;
    this.#log = log;
  }

  /** The runner stopped answering: its sandboxes' grace starts over when it is back. */
  forget(runnerKey: string): void {
    this.#seen.delete(runnerKey);
  }

  /** Destroys what `runtime` (the runner `runnerKey`) has held unclaimed for the grace period; answers their ids. */
  async sweep(runnerKey: string, runtime: SandboxRuntime, now = Date.now()): Promise<string[]> {
    const held = (await runtime.list()).map((s) => s.id);
    const seen = this.#seen.get(runnerKey) ?? new Map<string, number>();
    this.#seen.set(runnerKey, seen);
    if (!held.length) return (seen.clear(), []);
    const rows = (await execIn(this.#orm.em.fork())(
      `select id::text as id, state, runner_id from sandbox where id::text in (select jsonb_array_elements_text(?::jsonb))`,
      [JSON.stringify(held)],
    )) as Array<{ id: string; state: string; runner_id: string | null }>;
    const byId = new Map(rows.map((r) => [r.id, r]));
    const unclaimed = new Set(
      held.filter((id) => {
        const row = byId.get(id);
        return !row || row.state === "destroyed" || (row.runner_id !== null && row.runner_id !== runnerKey);
      }),
    );
    for (const id of seen.keys()) if (!unclaimed.has(id)) seen.delete(id);
    const removed: string[] = [];
    for (const id of unclaimed) {
      const since = seen.get(id);
      if (since === undefined) {
        seen.set(id, now);
        continue;
      }
      if (now - since < this.#graceMs) continue;
      try {
        await runtime.destroy(id);
        seen.delete(id);
        removed.push(id);
        this.#log(`runner ${runnerKey}: removed sandbox ${id}, which the database does not hold there`);
      } catch (err) {
        this.#log(`runner ${runnerKey}: removing stray sandbox ${id} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    return removed;
  }
}
