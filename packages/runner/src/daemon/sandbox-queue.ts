// One lifecycle call at a time per sandbox on a runner, in arrival order. Control holds its own
// lock per sandbox, but a control process that died may leave a call running here (a create
// whose caller is gone still finishes); the process that takes over then calls again (destroy,
// create) and must find that one finished, not race it.

export class SandboxQueue {
  readonly #tails = new Map<string, Promise<unknown>>();

  run<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const before = this.#tails.get(id) ?? Promise.resolve();
    const mine = before.then(fn, fn);
    const tail = mine.then(
      () => undefined,
      () => undefined,
    );
    this.#tails.set(id, tail);
    void tail.then(() => {
      if (this.#tails.get(id) === tail) this.#tails.delete(id);
    });
    return mine;
  }
}
