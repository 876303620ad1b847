import { Code, ConnectError } from "@connectrpc/connect";

/**
 * gRPC's length-prefixed messages: a flags byte (bit 0: compressed), a 4-byte big-endian length,
 * the message.
 */

const ENVELOPE_HEAD = 5;

/** One uncompressed message in its envelope. */
export function envelope(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(ENVELOPE_HEAD + message.byteLength);
  out[0] = 0;
  out.writeUInt32BE(message.byteLength, 1);
  out.set(message, ENVELOPE_HEAD);
  return out;
}

/** The envelopes of a body as they complete, however its chunks cut them; an envelope cut off by the end is an error. */
export async function* splitEnvelopes(body: AsyncIterable<Uint8Array>): AsyncGenerator<{ flags: number; data: Uint8Array }> {
  let pending: Buffer = Buffer.alloc(0);
  for await (const chunk of body) {
    pending = pending.length === 0 ? Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength) : Buffer.concat([pending, chunk]);
    while (pending.length >= ENVELOPE_HEAD) {
      const end = ENVELOPE_HEAD + pending.readUInt32BE(1);
      if (pending.length < end) break;
      yield { flags: pending[0], data: pending.subarray(ENVELOPE_HEAD, end) };
      pending = pending.subarray(end);
    }
  }
  if (pending.length > 0) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
}
