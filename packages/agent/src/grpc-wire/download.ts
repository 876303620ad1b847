import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { DownloadFileRequestSchema, DownloadFileResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { noteMoved } from "../util/gc-pacer.ts";
import { envelope, errorTrailers, isPlainGrpc } from "./plain-grpc.ts";
import { fileInfo } from "../files/file-info.ts";
import { CHUNK_SIZE, openForDownload } from "../files/transfer.ts";

/**
 * FileService.DownloadFile over plain gRPC, answered without Connect's
 * per-message pipeline: each data message is read from the file straight into
 * its own gRPC envelope (the envelope and field header written in front of
 * the bytes), instead of being copied into protobuf's writer and again into
 * an envelope. The call is otherwise what Connect makes of it: the same secret
 * check, request parsing, first message (the file's info), messages and
 * trailers. Other protocols and compressed requests are Connect's.
 */

/** Whether this request is a download this path takes. */
export function isDirectDownload(req: Http2ServerRequest): boolean {
  return req.url === "/sandbar.agent.v1.FileService/DownloadFile" && isPlainGrpc(req);
}

/** Envelope header (5) + field tag (1) + the chunk's length as a varint (3 bytes up to 2 MiB). */
const FRAME = 9;
/** The one field of a data message: field 2, length-delimited. */
const DATA_TAG = 0x12;

export interface DirectDownloadOptions {
  authorized(authorization: string | undefined): boolean;
  resolve(p: string): string;
  readMaxBytes: number;
}

/** Serves one download (isDirectDownload said yes); never rejects. */
export async function serveDirectDownload(req: Http2ServerRequest, res: Http2ServerResponse, opts: DirectDownloadOptions): Promise<void> {
  let fh: Awaited<ReturnType<typeof openForDownload>>["fh"] | undefined;
  const gone = () => res.stream.destroyed || res.stream.closed;
  try {
    if (!opts.authorized(req.headers.authorization)) throw errors.unauthenticated();
    const request = fromBinary(DownloadFileRequestSchema, await oneMessage(req, opts.readMaxBytes));
    const p = opts.resolve(request.path);
    fh = (await openForDownload(p)).fh;
    const st = await fh.stat({ bigint: true });
    const info = toBinary(DownloadFileResponseSchema, create(DownloadFileResponseSchema, { part: { case: "info", value: fileInfo(p, st) } }));
    if (gone()) return;
    res.writeHead(200, { "content-type": "application/grpc+proto" });
    if (!(await send(res, envelope(info)))) return;
    for (;;) {
      // A buffer per message: the socket may still hold the last one.
      const buf = Buffer.allocUnsafe(FRAME + CHUNK_SIZE);
      const { bytesRead } = await fh.read(buf, FRAME, CHUNK_SIZE, null);
      if (bytesRead === 0) break;
      if (gone()) return;
      noteMoved(bytesRead);
      const start = frame(buf, bytesRead);
      if (!(await send(res, buf.subarray(start, FRAME + bytesRead)))) return;
    }
    res.addTrailers({ "grpc-status": "0" });
    res.end();
  } catch (err) {
    if (gone()) return;
    if (!res.headersSent) res.writeHead(200, { "content-type": "application/grpc+proto" });
    res.addTrailers(errorTrailers(err));
    res.end();
  } finally {
    await fh?.close().catch(() => undefined);
  }
}

/**
 * Writes the envelope header and the data field's tag and length in front of
 * the `n` bytes at buf[FRAME..]; returns where the message starts.
 */
function frame(buf: Buffer, n: number): number {
  const lenBytes = n < 0x80 ? 1 : n < 0x4000 ? 2 : 3;
  const start = FRAME - 5 - 1 - lenBytes;
  buf[start] = 0;
  buf.writeUInt32BE(1 + lenBytes + n, start + 1);
  buf[start + 5] = DATA_TAG;
  let v = n;
  for (let i = 0; i < lenBytes; i++) {
    buf[start + 6 + i] = i === lenBytes - 1 ? v : (v & 0x7f) | 0x80;
    v = Math.floor(v / 128);
  }
  return start;
}

/** Writes a chunk, waiting while the stream's buffer is full; false once the caller is gone. */
function send(res: Http2ServerResponse, chunk: Uint8Array): Promise<boolean> | boolean {
  if (res.stream.destroyed) return false;
  if (res.write(chunk)) return true;
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      res.off("drain", onDrain);
      res.off("close", onClose);
      resolve(ok);
    };
    const onDrain = () => done(true);
    const onClose = () => done(false);
    res.on("drain", onDrain);
    res.on("close", onClose);
  });
}

/** The request body's one message (a unary request in a server-streaming call). */
async function oneMessage(req: AsyncIterable<Buffer>, readMaxBytes: number): Promise<Uint8Array> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += c.length;
    if (size > readMaxBytes + 5) throw new ConnectError(`message size is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted);
    chunks.push(c);
  }
  const body = Buffer.concat(chunks);
  if (body.length < 5 || body.readUInt32BE(1) !== body.length - 5) {
    throw new ConnectError("protocol error: expected one message", Code.InvalidArgument);
  }
  if ((body[0] & 1) !== 0) throw new ConnectError("protocol error: received compressed message but no compression was negotiated", Code.Internal);
  return body.subarray(5);
}
