import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { UploadFileRequestSchema, UploadFileResponseSchema, UploadFilesResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { envelope, errorTrailers, isPlainGrpc } from "./plain-grpc.ts";
import { UPLOAD_SEALED_HEADER, UploadReceiver } from "../files/upload-receiver.ts";

/**
 * FileService.UploadFile / UploadFiles over plain gRPC, decoded straight from
 * the HTTP/2 stream: a data message's bytes go to the file as the pieces of
 * the socket reads they arrived in, instead of being copied into a whole
 * message (Connect's envelope reader) and passed through Connect's per-message
 * pipeline. Everything else about the call is what Connect does: the same
 * secret check, the same UploadReceiver (so the same files and errors), an
 * answer with the same headers, body and trailers (`grpc-status`,
 * `grpc-message`). Other protocols (Connect, gRPC-web) and compressed
 * requests are Connect's.
 */

/** Request paths served here, and whether the method takes several files. */
const METHODS: Record<string, boolean> = {
  "/sandbar.agent.v1.FileService/UploadFile": false,
  "/sandbar.agent.v1.FileService/UploadFiles": true,
};

/** Whether this request is an upload this decoder takes (plain gRPC, binary, uncompressed). */
export function isDirectUpload(req: Http2ServerRequest): boolean {
  return Object.hasOwn(METHODS, req.url) && isPlainGrpc(req);
}

export interface DirectUploadOptions {
  /** Whether the call's `authorization` is the agent's. */
  authorized(authorization: string | undefined): boolean;
  /** A request path as the file it names (the service's own resolution). */
  resolve(p: string): string;
  /** Most bytes of one message. */
  readMaxBytes: number;
}

/** Serves one upload (isDirectUpload said yes); never rejects. */
export async function serveDirectUpload(req: Http2ServerRequest, res: Http2ServerResponse, opts: DirectUploadOptions): Promise<void> {
  const many = METHODS[req.url];
  const receiver = new UploadReceiver(opts.resolve, many);
  let answer: Uint8Array;
  try {
    if (!opts.authorized(req.headers.authorization)) throw errors.unauthenticated();
    const sealed = await decode(req, receiver, opts.readMaxBytes);
    // A stream the client reset ends early: what arrived is not the whole upload. (A Node client
    // that cancels sends its end of stream before the reset: a sealing caller says so.)
    if (req.aborted || (req.headers[UPLOAD_SEALED_HEADER] !== undefined && !sealed)) throw new ConnectError("the upload was cancelled", Code.Canceled);
    const files = await receiver.finish();
    answer = many
      ? toBinary(UploadFilesResponseSchema, create(UploadFilesResponseSchema, { files }))
      : toBinary(UploadFileResponseSchema, create(UploadFileResponseSchema, { file: files[0] }));
  } catch (err) {
    await receiver.abandon();
    respond(res, undefined, errorTrailers(err));
    return;
  }
  respond(res, envelope(answer), { "grpc-status": "0" });
}

/** Headers, the body (if any) and the trailers, unless the caller is gone. */
function respond(res: Http2ServerResponse, body: Uint8Array | undefined, trailers: Record<string, string>): void {
  if (res.stream.destroyed || res.headersSent) return;
  res.writeHead(200, { "content-type": "application/grpc+proto" });
  res.addTrailers(trailers);
  if (body) res.end(body);
  else res.end();
}

/** Envelope header (flags, length), then the first bytes of its message: enough for a data field's tag and length. */
const ENVELOPE_HEADER = 5;
const PREFIX = 11; // tag (1) + varint length (up to 10)
/** The one field of a data message: field 2, length-delimited. */
const DATA_TAG = 0x12;

/**
 * Reads the request's gRPC envelopes and hands their messages to the receiver
 * in order. A message that is exactly one data field streams: its bytes are
 * passed as they arrive (slices of the stream's chunks, no copy). Any other
 * message (a header, or data encoded otherwise) is gathered whole and parsed
 * with the schema.
 */
async function decode(req: AsyncIterable<Buffer>, receiver: UploadReceiver, readMaxBytes: number): Promise<boolean> {
  /** The last message was empty (a sealing caller's end of upload). */
  let sealed = false;
  const head = Buffer.alloc(ENVELOPE_HEADER);
  let headFill = 0;
  const prefix = Buffer.alloc(PREFIX);
  let prefixFill = 0;
  let prefixNeed = 0;
  /** Length of the current message; -1 between messages. */
  let length = -1;
  /** Bytes of a streaming data message still to come; -1 when not streaming. */
  let streaming = -1;
  let whole: Buffer | undefined;
  let wholeFill = 0;

  const onWhole = async (msg: Uint8Array) => {
    const m = fromBinary(UploadFileRequestSchema, msg);
    if (m.part.case === "header") await receiver.header(m.part.value.path);
    else if (m.part.case === "data") await receiver.data([m.part.value]);
  };

  for await (const chunk of req) {
    let at = 0;
    let pieces: Uint8Array[] = [];
    while (at < chunk.length) {
      if (length < 0) {
        const n = Math.min(ENVELOPE_HEADER - headFill, chunk.length - at);
        chunk.copy(head, headFill, at, at + n);
        headFill += n;
        at += n;
        if (headFill < ENVELOPE_HEADER) break;
        headFill = 0;
        if ((head[0] & 1) !== 0) throw new ConnectError("protocol error: received compressed message but no compression was negotiated", Code.Internal);
        length = head.readUInt32BE(1);
        if (length > readMaxBytes) throw new ConnectError(`message size ${length} is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted);
        prefixFill = 0;
        prefixNeed = Math.min(length, PREFIX);
        sealed = length === 0;
        if (length === 0) {
          length = -1; // An empty message: no part, nothing to do.
        }
      } else if (streaming >= 0) {
        const n = Math.min(streaming, chunk.length - at);
        pieces.push(chunk.subarray(at, at + n));
        at += n;
        streaming -= n;
        if (streaming === 0) {
          streaming = -1;
          length = -1;
          await receiver.data(pieces);
          pieces = [];
        }
      } else if (whole) {
        const n = Math.min(length - wholeFill, chunk.length - at);
        chunk.copy(whole, wholeFill, at, at + n);
        wholeFill += n;
        at += n;
        if (wholeFill === length) {
          const msg = whole;
          whole = undefined;
          length = -1;
          await onWhole(msg);
        }
      } else {
        const n = Math.min(prefixNeed - prefixFill, chunk.length - at);
        chunk.copy(prefix, prefixFill, at, at + n);
        prefixFill += n;
        at += n;
        if (prefixFill < prefixNeed) break;
        const field = dataField(prefix.subarray(0, prefixNeed), length);
        if (field) {
          // The data bytes already in the prefix are copied (the prefix buffer is reused); the rest stream.
          await receiver.data([Uint8Array.prototype.slice.call(prefix, field.start, prefixNeed)]);
          streaming = length - prefixNeed;
          if (streaming === 0) {
            streaming = -1;
            length = -1;
          }
        } else {
          whole = Buffer.allocUnsafe(length);
          prefix.copy(whole, 0, 0, prefixNeed);
          wholeFill = prefixNeed;
          if (wholeFill === length) {
            const msg = whole;
            whole = undefined;
            length = -1;
            await onWhole(msg);
          }
        }
      }
    }
    if (pieces.length > 0) await receiver.data(pieces);
  }
  if (length >= 0 || headFill > 0) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  return sealed;
}

/**
 * Where the data begins if the message is exactly one `data` field (tag, then
 * a varint length that accounts for the rest of the message); undefined for
 * any other message.
 */
function dataField(prefix: Uint8Array, length: number): { start: number } | undefined {
  if (prefix.length < 2 || prefix[0] !== DATA_TAG) return undefined;
  let size = 0;
  let mul = 1;
  for (let i = 1; i < prefix.length; i++) {
    const b = prefix[i];
    size += (b & 0x7f) * mul;
    mul *= 128;
    if ((b & 0x80) === 0) return i + 1 + size === length ? { start: i + 1 } : undefined;
  }
  return undefined;
}
