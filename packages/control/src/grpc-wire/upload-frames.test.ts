import { createHash, randomBytes } from "node:crypto";
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { UploadFileRequestSchema, UploadFilesRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { describe, expect, it } from "vitest";
import { framedDataField, UPLOAD_FRAME_BYTES, uploadFrames } from "./upload-frames.ts";

// The frames written by hand must be what connect writes: standard gRPC envelopes around the
// same protobuf messages. Decoded here as any gRPC server would (5-byte prefix, then fromBinary).

type Msg = MessageInitShape<typeof UploadFileRequestSchema>;

async function* messages(list: Msg[]): AsyncGenerator<Msg> {
  yield* list;
}

async function framesOf(list: Msg[]): Promise<Uint8Array[]> {
  const field = framedDataField(UploadFileRequestSchema)!;
  const out: Uint8Array[] = [];
  let last: { live: Uint8Array; copy: Buffer } | undefined;
  // As a socket write would: each piece is taken when given; the one before must still hold what
  // it held when the next is asked for (frame buffers are reused two frames later).
  for await (const piece of uploadFrames(UploadFileRequestSchema, field, messages(list))) {
    if (last) expect(Buffer.from(last.live).equals(last.copy)).toBe(true);
    last = { live: piece, copy: Buffer.from(piece) };
    out.push(last.copy);
  }
  return out;
}

/** Splits a byte stream into gRPC envelopes and decodes each as the method's request. */
function decode(pieces: Uint8Array[]) {
  const all = Buffer.concat(pieces);
  const decoded = [];
  let at = 0;
  while (at < all.length) {
    expect(all[at]).toBe(0); // uncompressed
    const len = all.readUInt32BE(at + 1);
    expect(at + 5 + len).toBeLessThanOrEqual(all.length);
    decoded.push({ len, msg: fromBinary(UploadFileRequestSchema, all.subarray(at + 5, at + 5 + len)) });
    at += 5 + len;
  }
  return decoded;
}

const sha256 = (chunks: Uint8Array[]) => chunks.reduce((h, c) => h.update(c), createHash("sha256")).digest("hex");

describe("uploadFrames", () => {
  it("finds the bytes field of both upload requests", () => {
    expect(framedDataField(UploadFileRequestSchema)?.number).toBe(2);
    expect(framedDataField(UploadFilesRequestSchema)?.number).toBe(2);
  });

  it("frames data of every size (varint length boundaries included) into messages a gRPC server decodes to the same content", async () => {
    const sizes = [0, 1, 127, 128, 16383, 16384, 65536, 100_000, 262143, 262144, 262145, 2_097_152 + 3, 5, 65536, 65536, 65536, 65536, 65536, 7];
    const chunks = sizes.map((n) => randomBytes(n));
    const list: Msg[] = [{ part: { case: "header", value: { path: "/tmp/x" } } }, ...chunks.map((c): Msg => ({ part: { case: "data", value: c } }))];
    const decoded = decode(await framesOf(list));
    expect(decoded[0].msg.part).toEqual({ case: "header", value: expect.objectContaining({ path: "/tmp/x" }) });
    const data = decoded.slice(1).map((d) => {
      expect(d.msg.part.case).toBe("data");
      return d.msg.part.value as Uint8Array;
    });
    expect(sha256(data)).toBe(sha256(chunks));
    expect(data.reduce((n, d) => n + d.length, 0)).toBe(sizes.reduce((a, b) => a + b, 0));
    // Joined up to the frame size; a message that large went alone.
    for (const d of data) expect(d.length <= UPLOAD_FRAME_BYTES || sizes.includes(d.length)).toBe(true);
    expect(data.length).toBeLessThan(chunks.length);
  });

  it("writes a message of a frame's size or more after its head, as it came (no copy)", async () => {
    const big = randomBytes(UPLOAD_FRAME_BYTES + 10);
    const field = framedDataField(UploadFileRequestSchema)!;
    const given: Uint8Array[] = [];
    for await (const piece of uploadFrames(UploadFileRequestSchema, field, messages([{ part: { case: "data", value: big } }]))) given.push(piece);
    expect(given[1]).toBe(big);
    const pieces = await framesOf([{ part: { case: "data", value: big } }]);
    expect(pieces).toHaveLength(2);
    expect(Buffer.from(decode(pieces)[0].msg.part.value as Uint8Array).equals(big)).toBe(true);
  });

  it("keeps other messages between data where they were, serialized as connect would", async () => {
    const a = randomBytes(1000);
    const b = randomBytes(2000);
    const list: Msg[] = [
      { part: { case: "header", value: { path: "one" } } },
      { part: { case: "data", value: a } },
      { part: { case: "header", value: { path: "two" } } },
      { part: { case: "data", value: b } },
    ];
    const pieces = await framesOf(list);
    const expected = list.map((m) => {
      const bytes = toBinary(UploadFileRequestSchema, create(UploadFileRequestSchema, m));
      const env = Buffer.alloc(5 + bytes.length);
      env.writeUInt32BE(bytes.length, 1);
      env.set(bytes, 5);
      return env;
    });
    // Byte for byte what connect's serialization and envelope produce.
    expect(Buffer.concat(pieces).equals(Buffer.concat(expected))).toBe(true);
  });

  it("passes an input failure on", async () => {
    async function* failing(): AsyncGenerator<Msg> {
      yield { part: { case: "data", value: randomBytes(10) } };
      throw new Error("the body broke off");
    }
    const field = framedDataField(UploadFileRequestSchema)!;
    const it = uploadFrames(UploadFileRequestSchema, field, failing());
    await expect((async () => {
      for await (const _ of it) void _;
    })()).rejects.toThrow("the body broke off");
  });
});
