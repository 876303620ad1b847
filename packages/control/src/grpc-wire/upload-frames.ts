import { create, isMessage, ScalarType, toBinary, type DescField, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";
import { envelope } from "@sandbar/protocol/grpc-wire";

/**
 * Size the data of an upload is gathered to before it goes to the agent as one message. The body
 * arrives in socket reads of 64 KiB or less; a message each would cost the agent's per-message
 * path (decode, write) 16 times per MiB. A quarter MiB keeps most of that saving while a message
 * holds its bytes only briefly (with 1 MiB the flat-memory transfer test saw 29 MiB of live
 * buffers once on a loaded machine).
 */
export const UPLOAD_FRAME_BYTES = 256 * 1024;

/** The envelope (flags, length) and, at most, a one-byte tag and a five-byte length varint. */
const MAX_HEAD = 5 + 1 + 5;

/**
 * The field of a client stream's request that carries file content: a `bytes data` member of a
 * oneof (`UploadFileRequest.part`, `UploadFilesRequest.part`). Such a stream's data messages can
 * be written as gRPC frames by hand.
 */
export function framedDataField(input: DescMessage): DescField | undefined {
  const field = input.fields.find((f) => f.localName === "data" && f.oneof !== undefined && f.fieldKind === "scalar" && f.scalar === ScalarType.BYTES);
  // One byte of tag (field numbers up to 15) keeps the head's size fixed.
  return field && field.number < 16 ? field : undefined;
}

/**
 * The gRPC frames (5-byte envelope + protobuf message) of a client stream's messages, as standard
 * as connect's own, without its copies: a data message's bytes are not serialized, enveloped and
 * concatenated (four copies of every byte) but written after a head made by hand (the envelope,
 * the field's tag and length). Consecutive data messages are joined into one message of up to
 * UPLOAD_FRAME_BYTES (one copy, of the small reads a body arrives in); a message that large
 * already goes as it came (no copy). Any other message is serialized as usual.
 *
 * The agent sees the same stream as before: it appends data messages in order, so joined data is
 * the same content.
 *
 * Joined frames are made in two buffers, in turn, for the whole stream: a fresh quarter MiB per
 * frame cost more than the copy (allocation, first-touch page faults, external memory for the
 * GC: 0.25 s of CPU per GiB against 0.03 reused). A buffer is filled again two frames after it
 * was given out; connect's HTTP/2 client (node-universal-client's sinkRequest) asks for the
 * next piece of a body only in the write callback of the one before, which HTTP/2 calls once
 * nghttp2 has written the bytes to the socket, so by then both earlier frames are sent.
 */
export async function* uploadFrames<I extends DescMessage>(schema: I, field: DescField, input: AsyncIterable<MessageInitShape<I>>): AsyncGenerator<Uint8Array> {
  const tag = (field.number << 3) | 2;
  const buffers: Buffer[] = [];
  let turn = 0;
  let batch: Buffer | undefined;
  let size = 0;
  let joined = 0;
  const flush = (): Buffer | undefined => {
    if (!batch || joined === 0) return undefined;
    const start = MAX_HEAD - head(batch, MAX_HEAD, tag, size);
    const frame = batch.subarray(start, MAX_HEAD + size);
    batch = undefined;
    turn ^= 1;
    size = 0;
    joined = 0;
    return frame;
  };
  for await (const msg of input) {
    const data = dataOf(msg, field);
    if (data === undefined) {
      const pending = flush();
      if (pending) yield pending;
      yield envelope(toBinary(schema, isMessage(msg, schema) ? msg : create(schema, msg)));
      continue;
    }
    if (data.length >= UPLOAD_FRAME_BYTES) {
      const pending = flush();
      if (pending) yield pending;
      const h = Buffer.allocUnsafe(MAX_HEAD);
      const n = head(h, MAX_HEAD, tag, data.length);
      yield h.subarray(MAX_HEAD - n);
      yield data;
      continue;
    }
    if (batch && size + data.length > UPLOAD_FRAME_BYTES) yield flush()!;
    batch ??= buffers[turn] ??= Buffer.allocUnsafe(MAX_HEAD + UPLOAD_FRAME_BYTES);
    batch.set(data, MAX_HEAD + size);
    size += data.length;
    joined++;
    if (size === UPLOAD_FRAME_BYTES) yield flush()!;
  }
  const pending = flush();
  if (pending) yield pending;
}

function dataOf(msg: unknown, field: DescField): Uint8Array | undefined {
  const oneof = (msg as Record<string, { case?: string; value?: unknown } | undefined>)[field.oneof!.localName];
  return oneof?.case === field.localName && oneof.value instanceof Uint8Array ? oneof.value : undefined;
}

/**
 * Writes, ending just before `end`, the envelope and the field's tag and length of a message
 * holding `size` bytes of data; returns the head's length.
 */
function head(buf: Buffer, end: number, tag: number, size: number): number {
  let len = 1;
  for (let v = size; v >= 0x80; v >>>= 7) len++;
  const n = 5 + 1 + len;
  let at = end - n;
  buf[at++] = 0; // not compressed
  buf.writeUInt32BE(1 + len + size, at);
  at += 4;
  buf[at++] = tag;
  let v = size;
  while (v >= 0x80) {
    buf[at++] = (v & 0x7f) | 0x80;
    v >>>= 7;
  }
  buf[at] = v;
  return n;
}
