import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import type { DescMethodUnary, DescService, Message } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { callKey, newCall } from "../call/call.ts";
import { asConnectError, encodeAnswer, isPlainUnary, parseTimeout, readUnaryRequest, setTrailerStatus, timeoutHeader, writeAnswer } from "../grpc-wire/index.ts";

/** Runs the method of a context on its input: the call chain's `unary`. */
type Invoke = (ctx: HandlerContext, input: Message) => Promise<Message>;

// Reasons given to the aborts every call makes as it ends (an abort without one builds a DOMException with its stack, per call).
const CLOSED = new ConnectError("the stream closed", Code.Canceled);
const ENDED = new ConnectError("the call ended", Code.Canceled);

/**
 * Unary gRPC calls of the given services (the toolbox's: exec among them) served without
 * Connect's handler pipeline (async iterables, envelope transforms, response adapters: about
 * 1 ms of CPU per call, more than the call's own work). Only the plain case is taken: HTTP/2,
 * POST, binary protobuf, no request compression; anything else goes to Connect. The methods
 * run through the call chain like every other way in (the request's Call on a context from
 * Connect's own factory). This file is the adapter (which calls, the
 * context, the implementation); the wire (request message, statuses, answer) is grpc-wire's,
 * pinned to Connect's own by grpc-wire/wire.test.ts: the answers are Connect's, uncompressed.
 */
export function grpcUnaryFastPath(services: DescService[], invoke: Invoke, readMaxBytes: number) {
  const byPath = new Map<string, DescMethodUnary>();
  for (const service of services) {
    for (const method of service.methods) {
      if (method.methodKind === "unary") byPath.set(`/${service.typeName}/${method.name}`, method as DescMethodUnary);
    }
  }

  /** Serves the request when it is a plain unary call of these services; false leaves it to Connect. */
  return function serve(request: IncomingMessage | Http2ServerRequest, response: ServerResponse | Http2ServerResponse): boolean {
    if (request.httpVersionMajor !== 2) return false;
    const req = request as Http2ServerRequest;
    const res = response as Http2ServerResponse;
    const target = byPath.get(req.url);
    if (!target || !isPlainUnary(req)) return false;
    call(target, invoke, req, res, readMaxBytes).catch(() => res.stream.destroy());
    return true;
  };
}

async function call(method: DescMethodUnary, invoke: Invoke, req: Http2ServerRequest, res: Http2ServerResponse, readMaxBytes: number): Promise<void> {
  const abort = new AbortController();
  // As Connect's adapter: the call's signal is aborted once the stream closes (the client went away, or done).
  req.once("close", () => abort.abort(CLOSED));
  const timeout = parseTimeout(timeoutHeader(req), Number.MAX_SAFE_INTEGER);
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
    const input = await readUnaryRequest(method, req, readMaxBytes, CLOSED);
    body = encodeAnswer(method, await invoke(ctx, input));
  } catch (err) {
    body = undefined;
    setTrailerStatus(ctx.responseTrailer, asConnectError(err));
  } finally {
    ctx.abort(ENDED); // clears the deadline timer, as Connect does when a call ends
  }
  writeAnswer(res, ctx.responseHeader, body, ctx.responseTrailer);
}
