// One lifecycle operation at a time per sandbox. A second one is not queued: the caller is told
// a state change is in progress (409), as the reference answers.

export class OperationLocks {
  readonly #running = new Map<string, Promise<unknown>>();

  busy(id: string): boolean {
    return this.#running.has(id);
  }

  /** Runs `fn` holding the sandbox's lock; undefined (and `fn` not run) when it is held. */
  tryRun<T>(id: string, fn: () => Promise<T>): Promise<T> | undefined {
    if (this.#running.has(id)) return undefined;
    let release!: () => void;
    this.#running.set(id, new Promise<void>((r) => (release = r)));
    const run = (async () => fn())();
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
