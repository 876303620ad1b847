import type { DescField } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

/**
 * Bytes of upload data control has handed to one agent connection (node's HTTP/2 stream queues)
 * and not yet written to its socket. Node counts them against the session's maxSessionMemory
 * and, past it, refuses any HEADERS the session then receives: the agent's answer to an upload it
 * had written whole was reset (ENHANCE_YOUR_CALM) and the upload answered 500. Each upload holds
 * one piece at a time in those queues (connect asks for the next in the write callback of the
 * one before, once nghttp2 has written it to the socket), so uploads side by side queued a frame
 * each: about 40 filled node's default 10 MB. Pieces now wait for room here, in turn.
 */
export class SendBudget {
  readonly capacity: number;
  #free: number;
  readonly #waiting: { bytes: number; go: () => void }[] = [];

  constructor(capacity: number) {
    this.capacity = capacity;
    this.#free = capacity;
  }

  /** Takes room for a piece (the whole budget for a larger one): undefined if there was room at once. */
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

/** How far an upload got on its way to the agent: what an answer lost on the way can still say. */
export interface UploadProgress {
  /** The file being sent (the last header message), and how many files the call has begun. */
  path?: string;
  files: number;
  /** Every piece of the body was handed to the connection. */
  whole: boolean;
}

/** The upload's messages as they go, noting which file is being sent. */
export async function* noting<M>(messages: AsyncIterable<M>, field: DescField, progress: UploadProgress): AsyncGenerator<M> {
  const oneof = field.oneof!.localName;
  for await (const msg of messages) {
    const part = (msg as Record<string, { case?: string; value?: { path?: string } } | undefined>)[oneof];
    if (part?.case === "header") {
      progress.path = part.value?.path;
      progress.files++;
    }
    yield msg;
  }
}

/** The pieces of an upload's body, each taking room in the connection's budget until node has written it. */
export async function* budgeted(pieces: AsyncIterable<Uint8Array>, budget: SendBudget, progress: UploadProgress): AsyncGenerator<Uint8Array> {
  let held = 0;
  try {
    for await (const piece of pieces) {
      const wait = budget.take(piece.length);
      if (wait) await wait;
      held = piece.length;
      yield piece;
      // Asked for the next piece: this one is on the socket.
      budget.give(held);
      held = 0;
    }
    progress.whole = true;
  } finally {
    if (held) budget.give(held);
  }
}

/**
 * An upload whose call failed without an answer from the agent (the stream or the connection
 * broke): what is known of its file, as UNAVAILABLE (503; sending it again rewrites the file).
 */
export function lostAnswer(err: unknown, progress: UploadProgress): ConnectError {
  const cause = ConnectError.from(err);
  const file = progress.path === undefined ? "the upload" : `the upload of ${progress.path}`;
  const before = progress.files > 1 ? `; the ${progress.files - 1} file(s) before it in this call were sent whole, and whether they were written is unknown` : "";
  const message = progress.whole
    ? `${file} was sent whole, but the sandbox's answer was lost (${cause.rawMessage}): whether the file was written completely is unknown; read it back, or upload it again (an upload rewrites the file)${before}`
    : `${file} broke off before all of it was sent (${cause.rawMessage}): it did not take effect (a file is replaced only by a complete upload; one written in place, a FIFO or a hard-linked file, is incomplete); upload it again${before}`;
  return new ConnectError(message, Code.Unavailable, undefined, undefined, err);
}
