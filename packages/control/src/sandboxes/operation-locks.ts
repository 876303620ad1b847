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

  /** Settles once the sandbox's operation running now (if any) has let go of its lock. */
  released(id: string): Promise<unknown> {
    return this.#running.get(id) ?? Promise.resolve();
  }

  /** Runs `fn` holding the sandbox's lock; undefined (and `fn` not run) when it is held here; rejects with HeldElsewhere when another process holds it. */
  tryRun<T>(id: string, fn: () => Promise<T>): Promise<T> | undefined {
    return this.#run(id, fn, this.#shared);
  }

  /** Runs `fn` holding this process's lock, and the shared one first when given. */
  #run<T>(id: string, fn: () => Promise<T>, shared: SharedLocks | undefined): Promise<T> | undefined {
    if (this.#running.has(id)) return undefined;
    let release!: () => void;
    this.#running.set(id, new Promise<void>((r) => (release = r)));
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

  /**
   * `tryRun` for a sandbox whose row does not exist yet (a create): no other process can name it
   * before that row commits, so `fn` starts at once and the shared lock is taken alongside (a
   * round trip off the create's critical path). `fn` gets `held`, which settles once the lock is
   * taken (rejecting with HeldElsewhere if it was not), and must await it before its row commits.
   */
  tryRunNew<T>(id: string, fn: (held: Promise<void>) => Promise<T>): Promise<T> | undefined {
    const shared = this.#shared;
    if (!shared) return this.tryRun(id, () => fn(Promise.resolve()));
    return this.#run(id, async () => {
      const taken = shared.acquire(id);
      const held = taken.then((ok) => {
        if (!ok) throw new HeldElsewhere();
      });
      held.catch(() => undefined); // `fn` may fail before it awaits the lock
      try {
        return await fn(held);
      } finally {
        if (await taken.catch(() => false)) await shared.release(id).catch(() => undefined);
      }
    }, undefined);
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
