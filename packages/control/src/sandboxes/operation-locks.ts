import { Code, ConnectError } from "@sandbar/protocol";
import type { SharedLocks } from "./cluster-locks.ts";

// One lifecycle operation at a time per sandbox. A second one is not queued: the caller is told
// a state change is in progress (409), as the reference answers. With shared locks
// (cluster-locks.ts) that holds across every control process of the database too.

/** Another control process is working on the sandbox. */
export class HeldElsewhere extends ConnectError {
  constructor() {
    super("Sandbox state change in progress", Code.Aborted);
  }
}

export class OperationLocks {
  readonly #running = new Map<string, Promise<unknown>>();
  readonly #shared: SharedLocks | undefined;

  constructor(shared?: SharedLocks) {
    this.#shared = shared;
  }

  busy(id: string): boolean {
    return this.#running.has(id);
  }

  /** Runs `fn` holding the sandbox's lock; undefined (and `fn` not run) when it is held here; rejects with HeldElsewhere when another process holds it. */
  tryRun<T>(id: string, fn: () => Promise<T>): Promise<T> | undefined {
    if (this.#running.has(id)) return undefined;
    let release!: () => void;
    this.#running.set(id, new Promise<void>((r) => (release = r)));
    const shared = this.#shared;
    const run = (async () => {
      if (!shared) return fn();
      if (!(await shared.acquire(id))) throw new HeldElsewhere();
      try {
        return await fn();
      } finally {
        await shared.release(id).catch(() => undefined);
      }
    })();
    void run.then(
      () => undefined,
      () => undefined,
    ).finally(() => {
      this.#running.delete(id);
      release();
    });
    return run;
  }

  /** Settles when every operation running now has finished (or `timeoutMs` passed). */
  async idle(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled([...this.#running.values()]),
      new Promise<void>((r) => (timer = setTimeout(r, timeoutMs))),
    ]);
    clearTimeout(timer);
  }
}
