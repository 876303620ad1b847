import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import { create, fromBinary, toBinary, type DescMethod, type DescMethodUnary, type DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, createHandlerContext } from "@connectrpc/connect";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { callKey, newCall } from "../call/call.ts";
import type { Impl } from "../call/chain.ts";

// Reasons given to the aborts every call makes as it ends (an abort without one builds a DOMException with its stack, per call).
const CLOSED = new ConnectError("the stream closed", Code.Canceled);
const ENDED = new ConnectError("the call ended", Code.Canceled);

/**
 * Unary gRPC calls of the given services (the toolbox's: exec among them) served without
 * Connect's handler pipeline (async iterables, envelope transforms, response adapters: about
 * 1 ms of CPU per call, more than the call's own work). Only the plain case is taken: HTTP/2,
 * POST, binary protobuf, no request compression; anything else goes to Connect. The secured
 * implementations are the ones the Connect router and the REST gateway call (the guard first),
 * the context comes from Connect's own factory, and statuses, error metadata and details are
 * written by Connect's setTrailerStatus: the answers are Connect's, without compressing them.
 */
export function grpcUnaryFastPath(services: DescService[], handlerOf: (method: DescMethod) => Impl, readMaxBytes: number) {
  const byPath = new Map<string, { method: DescMethodUnary; impl: Impl }>();
  for (const service of services) {
    for (const method of service.methods) {
      if (method.methodKind === "unary") byPath.set(`/${service.typeName}/${method.name}`, { method: method as DescMethodUnary, impl: handlerOf(method) });
    }
  }

  /** Serves the request when it is a plain unary call of these services; false leaves it to Connect. */
  return function serve(request: IncomingMessage | Http2ServerRequest, response: ServerResponse | Http2ServerResponse): boolean {
    if (request.httpVersionMajor !== 2 || request.method !== "POST") return false;
    const req = request as Http2ServerRequest;
    const res = response as Http2ServerResponse;
    const target = byPath.get(req.url);
    if (!target) return false;
    const h = req.headers;
    if (h["content-type"] !== "application/grpc" && h["content-type"] !== "application/grpc+proto") return false;
    if (h["grpc-encoding"] !== undefined && h["grpc-encoding"] !== "identity") return false;
    call(target.method, target.impl, req, res, readMaxBytes).catch(() => res.stream.destroy());
    return true;
  };
}

async function call(method: DescMethodUnary, impl: Impl, req: Http2ServerRequest, res: Http2ServerResponse, readMaxBytes: number): Promise<void> {
  const abort = new AbortController();
  // As Connect's adapter: the call's signal is aborted once the stream closes (the client went away, or done).
  req.once("close", () => abort.abort(CLOSED));
  const timeout = parseTimeout(headerValue(req.headers["grpc-timeout"]), Number.MAX_SAFE_INTEGER);
  const call = newCall(req);
  const ctx = createHandlerContext({
    service: method.parent,
    method,
    protocolName: "grpc",
    requestMethod: "POST",
    url: `http://${req.authority}${req.url}`,
    timeoutMs: timeout.timeoutMs,
    requestSignal: abort.signal,
    requestHeader: call.header,
    responseHeader: { "content-type": "application/grpc+proto" },
    responseTrailer: { "grpc-status": "0" },
    contextValues: createContextValues().set(callKey, call),
  });
  let body: Buffer | undefined;
  try {
    if (timeout.error) throw timeout.error;
    const input = fromEnvelope(method, await readEnvelopes(req, readMaxBytes));
    const output = create(method.output, (await impl(input, ctx)) as never);
    const bytes = toBinary(method.output, output);
    body = Buffer.allocUnsafe(5 + bytes.byteLength);
    body[0] = 0;
    body.writeUInt32BE(bytes.byteLength, 1);
    body.set(bytes, 5);
  } catch (err) {
    body = undefined;
    setTrailerStatus(ctx.responseTrailer, err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err));
  } finally {
    ctx.abort(ENDED); // clears the deadline timer, as Connect does when a call ends
  }
  if (res.stream.destroyed || res.stream.closed || res.headersSent) return;
  try {
    res.writeHead(200, nodeHeaders(ctx.responseHeader));
    if (body) res.write(body);
    res.addTrailers(nodeHeaders(ctx.responseTrailer));
    res.end();
  } catch {
    res.stream.destroy(); // the stream went away as the answer was written: nobody to tell
  }
}

/** The request body: envelopes, up to one message of readMaxBytes (the size is known from the first envelope's prefix). */
function readEnvelopes(req: Http2ServerRequest, readMaxBytes: number): Promise<Buffer> {
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
    req.once("close", () => reject(CLOSED));
  });
}

/** The one message of a unary request, as Connect's pipeline reports a body that is not exactly one. */
function fromEnvelope(method: DescMethodUnary, data: Buffer): unknown {
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

function headerValue(v: string | string[] | undefined): string | null {
  return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
}

function nodeHeaders(h: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  h.forEach((v, k) => (out[k] = v));
  return out;
}
