/**
 * A background pass run every `everyMs`, counted from the end of the previous one (passes never
 * overlap), on an unref'd timer (it never keeps the process alive). A failed pass is reported and
 * the loop goes on; `stop` waits for a pass in progress.
 */
export class Periodic {
  readonly #pass: () => Promise<unknown>;
  readonly #everyMs: number;
  readonly #onError: (err: unknown) => void;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = true;

  constructor(pass: () => Promise<unknown>, everyMs: number, onError: (err: unknown) => void) {
    this.#pass = pass;
    this.#everyMs = everyMs;
    this.#onError = onError;
  }

  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#schedule();
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#running = this.#pass()
        .then(() => undefined, this.#onError)
        .finally(() => {
          this.#running = undefined;
          this.#schedule();
        });
    }, this.#everyMs);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#running;
  }
}
