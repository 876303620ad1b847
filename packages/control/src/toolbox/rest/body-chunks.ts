import type { IncomingMessage } from "node:http";

/** How many bytes of a request body may be read ahead of its consumer before the socket is paused. */
const READ_AHEAD = 256 * 1024;

/**
 * A request body's reads as they come (the stream's own iterator would concatenate whatever
 * waits: a copy of every byte). Paused while a quarter MiB waits, which holds back the client.
 * A body that breaks off is an error; stopping early drains the rest (read and dropped), so the
 * connection can answer.
 */
export async function* bodyChunks(req: IncomingMessage): AsyncGenerator<Buffer> {
  const waiting: Buffer[] = [];
  let bytes = 0;
  let ended = false;
  let failure: Error | undefined;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const onData = (chunk: Buffer) => {
    waiting.push(chunk);
    bytes += chunk.length;
    if (bytes >= READ_AHEAD) req.pause();
    notify();
  };
  const onEnd = () => {
    ended = true;
    notify();
  };
  const onError = (err: Error) => {
    failure ??= err;
    notify();
  };
  const onClose = () => {
    if (!req.complete) failure ??= new Error("the upload was interrupted");
    notify();
  };
  req.on("data", onData).on("end", onEnd).on("error", onError).on("close", onClose);
  try {
    for (;;) {
      const chunk = waiting.shift();
      if (chunk) {
        bytes -= chunk.length;
        if (bytes < READ_AHEAD && req.isPaused()) req.resume();
        yield chunk;
        continue;
      }
      if (ended) return;
      if (failure) throw failure;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    req.off("data", onData).off("end", onEnd).off("error", onError).off("close", onClose);
    if (!ended) {
      req.on("error", () => undefined); // a reset while draining: nobody listens any more
      req.resume();
    }
  }
}
