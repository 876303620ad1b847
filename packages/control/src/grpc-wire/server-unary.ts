import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { fromBinary, toBinary, type DescMethodUnary, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { envelope } from "@sandbar/protocol/grpc-wire";

/**
 * The wire of a unary gRPC call served without Connect's handler pipeline (rpc/grpc-unary.ts is
 * the adapter that calls the implementation): which requests it takes, the request's one message,
 * the answer. Errors are those Connect's gRPC handler gives the same bodies.
 */

/** A POST in plain gRPC (binary protobuf, no request compression) over HTTP/2: the only kind taken; the rest is Connect's. */
export function isPlainUnary(req: Http2ServerRequest): boolean {
  if (req.httpVersionMajor !== 2 || req.method !== "POST") return false;
  const h = req.headers;
  if (h["content-type"] !== "application/grpc" && h["content-type"] !== "application/grpc+proto") return false;
  return h["grpc-encoding"] === undefined || h["grpc-encoding"] === "identity";
}

/** The request's one message, read up to readMaxBytes (the size is known from the first envelope's prefix). */
export async function readUnaryRequest(method: DescMethodUnary, req: Http2ServerRequest, readMaxBytes: number, closed: ConnectError): Promise<Message> {
  return fromEnvelope(method, await readEnvelopes(req, readMaxBytes, closed));
}

/** The answer's body: the output in its envelope. */
export function encodeAnswer(method: DescMethodUnary, output: Message): Buffer {
  return envelope(toBinary(method.output, output));
}

/** Headers, the body (none for an error: trailers-only in content) and trailers, unless the stream went away. */
export function writeAnswer(res: Http2ServerResponse, header: Headers, body: Buffer | undefined, trailer: Headers): void {
  if (res.stream.destroyed || res.stream.closed || res.headersSent) return;
  try {
    res.writeHead(200, nodeHeaders(header));
    if (body) res.write(body);
    res.addTrailers(nodeHeaders(trailer));
    res.end();
  } catch {
    res.stream.destroy(); // the stream went away as the answer was written: nobody to tell
  }
}

/** The grpc-timeout header as one value (null: none). */
export function timeoutHeader(req: Http2ServerRequest): string | null {
  const v = req.headers["grpc-timeout"];
  return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
}

/** The request body: envelopes, up to one message of readMaxBytes. `closed`: the error of a stream reset before its end. */
function readEnvelopes(req: Http2ServerRequest, readMaxBytes: number, closed: ConnectError): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let expected: number | undefined;
    const stop = (err: ConnectError) => {
      req.off("data", onData);
      req.resume(); // the rest is read and dropped
      reject(err);
    };
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
      if (expected === undefined && size >= 5) {
        const declared = (chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)).readUInt32BE(1);
        if (declared > readMaxBytes) return stop(new ConnectError(`message size ${declared} is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted));
        expected = 5 + declared;
      }
      if (expected !== undefined && size > expected) stop(new ConnectError("protocol error: received extra input message for unary method", Code.Unimplemented));
    };
    req.on("data", onData);
    req.once("end", () => resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)));
    req.once("error", (err) => reject(ConnectError.from(err, Code.Aborted)));
    // A stream reset before its end: no "end" comes (rejecting after a resolve changes nothing).
    req.once("close", () => reject(closed));
  });
}

/** The one message of a unary request, as Connect's pipeline reports a body that is not exactly one. */
function fromEnvelope(method: DescMethodUnary, data: Buffer): Message {
  if (data.length === 0) throw new ConnectError("protocol error: missing input message for unary method", Code.Unimplemented);
  if (data.length < 5) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  if (data[0] & 0b1) throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
  const size = data.readUInt32BE(1);
  if (data.length < 5 + size) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  if (data.length > 5 + size) throw new ConnectError("protocol error: received extra input message for unary method", Code.Unimplemented);
  try {
    return fromBinary(method.input, data.subarray(5));
  } catch (err) {
    throw new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.Internal);
  }
}

function nodeHeaders(h: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  h.forEach((v, k) => (out[k] = v));
  return out;
}
