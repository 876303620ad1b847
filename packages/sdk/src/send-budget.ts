/**
 * Bytes of client-stream messages (upload data) this client has handed to its HTTP/2 connection
 * and node has not yet written to the socket. Node counts them against the session's
 * maxSessionMemory and, past it, refuses any HEADERS the session then receives: the answer to an
 * upload the sandbox had written whole was reset (ENHANCE_YOUR_CALM). Each upload holds one
 * message at a time there (connect asks for the next once the one before is written), so 10
 * uploads side by side of 1 MiB messages filled node's default 10 MB. Messages now wait for room
 * here, in turn. (Control's connections to agents do the same: its toolbox/send-budget.ts.)
 */
export class SendBudget {
  readonly capacity: number;
  #free: number;
  readonly #waiting: { bytes: number; go: () => void }[] = [];

  constructor(capacity: number) {
    this.capacity = capacity;
    this.#free = capacity;
  }

  /** Takes room for a message (the whole budget for a larger one): undefined if there was room at once. */
  take(bytes: number): Promise<void> | undefined {
    const n = Math.min(bytes, this.capacity);
    if (this.#waiting.length === 0 && this.#free >= n) {
      this.#free -= n;
      return undefined;
    }
    return new Promise((go) => this.#waiting.push({ bytes: n, go }));
  }

  /** Gives back what take(bytes) took. */
  give(bytes: number): void {
    this.#free += Math.min(bytes, this.capacity);
    while (this.#waiting.length > 0 && this.#free >= this.#waiting[0].bytes) {
      const next = this.#waiting.shift()!;
      this.#free -= next.bytes;
      next.go();
    }
  }
}

/** The bytes fields of a message, at its top level or in a oneof (an upload's `part.data`). */
function payloadBytes(msg: unknown): number {
  let n = 0;
  for (const v of Object.values(msg as Record<string, unknown>)) {
    if (v instanceof Uint8Array) n += v.length;
    else if (v && typeof v === "object" && (v as { value?: unknown }).value instanceof Uint8Array) n += (v as { value: Uint8Array }).value.length;
  }
  return n;
}

/** A client stream's messages, each taking room in the connection's budget until the next is asked for (it is written then). */
export async function* budgeted<M>(messages: AsyncIterable<M>, budget: SendBudget): AsyncGenerator<M> {
  let held = 0;
  try {
    for await (const msg of messages) {
      const bytes = payloadBytes(msg);
      const wait = budget.take(bytes);
      if (wait) await wait;
      held = bytes;
      yield msg;
      budget.give(held);
      held = 0;
    }
  } finally {
    if (held) budget.give(held);
  }
}
