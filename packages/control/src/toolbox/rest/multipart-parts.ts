import type { IncomingMessage } from "node:http";
import type { Readable } from "node:stream";
import busboy from "busboy";
import { errors } from "@sandbar/protocol";

/** One part of a multipart/form-data body: a text field, or a file whose bytes stream. */
export type FormPart =
  | { kind: "field"; name: string; value: string; truncated: boolean }
  | { kind: "file"; name: string; filename: string | undefined; stream: Readable };

/**
 * The parts of a multipart/form-data request, in order, as they arrive. A file part must be read
 * to its end (or resumed) before the next part is pulled: busboy waits for it, which is how a
 * slow consumer holds back the request body (nothing is buffered beyond the stream's watermark).
 */
export async function* formParts(req: IncomingMessage): AsyncGenerator<FormPart> {
  let bb: busboy.Busboy;
  try {
    bb = busboy({ headers: req.headers, preservePath: true, fileHwm: 256 * 1024 });
  } catch (err) {
    throw errors.invalidArgument(`Expected a multipart/form-data body: ${(err as Error).message}`);
  }
  const queue: FormPart[] = [];
  let finished = false;
  let failure: Error | undefined;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  bb.on("field", (name, value, info) => {
    queue.push({ kind: "field", name, value, truncated: info.valueTruncated });
    notify();
  });
  bb.on("file", (name, stream, info) => {
    // A broken body errors the part's stream too; busboy's own error event is what reports it.
    stream.on("error", () => undefined);
    queue.push({ kind: "file", name, filename: info.filename, stream });
    notify();
  });
  bb.on("close", () => {
    finished = true;
    notify();
  });
  bb.on("error", (err: Error) => {
    failure ??= err;
    notify();
  });
  req.on("close", () => {
    if (!req.complete) {
      failure ??= new Error("the upload was interrupted");
      notify();
    }
  });
  req.pipe(bb);
  try {
    for (;;) {
      if (failure) throw errors.invalidArgument(`Malformed multipart/form-data body: ${failure.message}`);
      const part = queue.shift();
      if (part) {
        yield part;
        continue;
      }
      if (finished) return;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    if (!finished) {
      // The consumer stopped early (an error): stop parsing; the response says what went wrong.
      req.unpipe(bb);
      bb.destroy();
      for (const p of queue) if (p.kind === "file") p.stream.destroy();
      req.resume();
    }
  }
}

/** How many bytes of a file part may wait for its consumer before the part is paused. */
const PART_WATERMARK = 256 * 1024;

/**
 * A file part's bytes, in the pieces the parser cut them (slices of the body's reads, never
 * joined: the stream's own iterator would concatenate whatever waits, a copy of every byte);
 * the part is paused while a quarter MiB waits, which holds back the request body. A body that
 * breaks off mid-part is the client's error.
 */
export async function* fileChunks(stream: Readable): AsyncGenerator<Buffer> {
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
    if (bytes >= PART_WATERMARK) stream.pause();
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
  stream.on("data", onData).on("end", onEnd).on("error", onError);
  try {
    for (;;) {
      const chunk = waiting.shift();
      if (chunk) {
        bytes -= chunk.length;
        if (bytes < PART_WATERMARK && stream.isPaused()) stream.resume();
        yield chunk;
        continue;
      }
      if (failure) throw errors.invalidArgument(`Malformed multipart/form-data body: ${failure.message}`);
      if (ended) return;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } finally {
    stream.off("data", onData).off("end", onEnd).off("error", onError);
    // Stopped early (an error): the rest of the part is not wanted.
    if (!ended) stream.destroy();
  }
}

/** A small part's whole content as text (a path sent as a file part). */
export async function partText(part: FormPart, limit = 64 * 1024): Promise<string> {
  if (part.kind === "field") {
    if (part.truncated) throw errors.invalidArgument(`${part.name} is too long`);
    return part.value;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of fileChunks(part.stream)) {
    size += chunk.length;
    if (size > limit) throw errors.invalidArgument(`${part.name} is too long`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}
