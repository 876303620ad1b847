import type { SandboxStore } from "./store.ts";

// Activity stamps: what the auto-stop timer measures. A sandbox's stamp is written at most once
// per throttle period (toolbox calls would otherwise write a row each).

export class ActivityStamps {
  readonly #store: SandboxStore;
  readonly #everyMs: number;
  readonly #log: (line: string) => void;
  readonly #touched = new Map<string, number>();

  constructor(store: SandboxStore, everyMs: number, log: (line: string) => void) {
    this.#store = store;
    this.#everyMs = everyMs;
    this.#log = log;
  }

  /** Records activity, at most once per throttle period. */
  touch(id: string): void {
    const now = Date.now();
    const last = this.#touched.get(id);
    if (last !== undefined && now - last < this.#everyMs) return;
    this.#touched.set(id, now);
    if (this.#touched.size > 10_000) this.#touched.clear();
    this.#store.touch(id, new Date(now)).catch((err: unknown) => this.#log(`sandbox ${id}: activity stamp failed: ${String(err)}`));
  }

  /** The row was stamped just now by the operation's own write: no stamp for a throttle period. */
  stamped(id: string): void {
    this.#touched.set(id, Date.now());
  }

  forget(id: string): void {
    this.#touched.delete(id);
  }
}
