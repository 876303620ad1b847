// Serialises operations on one sandbox (create/start/stop/destroy/pack/restore) while letting
// different sandboxes proceed in parallel.

export class KeyedLock {
  readonly #tails = new Map<string, Promise<void>>();

  /** Waits for earlier holders of `key`; the returned function releases it. */
  async acquire(key: string): Promise<() => void> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.#tails.set(key, tail);
    await prev;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      release();
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    };
  }

  async with<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const release = await this.acquire(key);
    try {
      return await fn();
    } finally {
      release();
    }
  }
}
