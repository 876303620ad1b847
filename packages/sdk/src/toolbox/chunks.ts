/** Upload data in messages of at most this size: well under gRPC's default 4 MiB message limit. */
export const CHUNK_BYTES = 1 << 20;

/** What an upload accepts: bytes, text, or a stream of bytes (a Node Readable, a web ReadableStream, any async iterable). */
export type UploadSource = Uint8Array | string | AsyncIterable<Uint8Array> | ReadableStream<Uint8Array>;

/**
 * The source as chunks of at most CHUNK_BYTES, pulled one at a time: a stream is read only as
 * fast as the connection takes it, so memory stays flat whatever the size.
 */
export async function* chunksOf(source: UploadSource): AsyncGenerator<Uint8Array> {
  if (typeof source === "string") source = new TextEncoder().encode(source);
  if (source instanceof Uint8Array) {
    for (let at = 0; at < source.length; at += CHUNK_BYTES) yield source.subarray(at, at + CHUNK_BYTES);
    return;
  }
  const iterable: AsyncIterable<Uint8Array> = Symbol.asyncIterator in source ? source : webStream(source);
  for await (const chunk of iterable) {
    if (!(chunk instanceof Uint8Array)) throw new TypeError("upload source must yield Uint8Array chunks (open streams without an encoding)");
    for (let at = 0; at < chunk.length; at += CHUNK_BYTES) yield chunk.subarray(at, at + CHUNK_BYTES);
  }
}

async function* webStream(stream: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = stream.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.releaseLock();
  }
}
