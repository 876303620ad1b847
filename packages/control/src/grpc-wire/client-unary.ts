import { constants, type ClientHttp2Stream, type IncomingHttpHeaders } from "node:http2";
import { create, fromBinary, toBinary, type DescMessage, type DescMethodUnary, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { envelope, validateResponse, validateTrailer } from "@sandbar/protocol/grpc-wire";

export interface UnaryOptions {
  /** Request metadata (the agent's bearer secret). */
  headers: Record<string, string>;
  signal?: AbortSignal;
  /** Sent as grpc-timeout and enforced here too (DEADLINE_EXCEEDED). */
  timeoutMs?: number;
  /** The response headers as received (before the message). */
  onHeader?(headers: IncomingHttpHeaders): void;
}

/**
 * One unary gRPC call on an agent's HTTP/2 session: one stream, one frame out, one in. Connect's
 * client does the same through async iterables, linked abort signals and web Headers, which cost
 * 0.5-0.6 ms of CPU per call (3x this); every toolbox exec pays it. Statuses are read as
 * Connect's gRPC client reads them (@sandbar/protocol/grpc-wire, pinned by wire.test.ts), so errors, their metadata
 * and details are what Connect's client would raise.
 */
export async function agentUnary<I extends DescMessage, O extends DescMessage>(
  session: Http2SessionManager,
  method: DescMethodUnary<I, O>,
  input: MessageInitShape<I>,
  opts: UnaryOptions,
): Promise<MessageShape<O>> {
  const { signal, timeoutMs } = opts;
  if (signal?.aborted) throw ConnectError.from(signal.reason, Code.Canceled);
  if (timeoutMs !== undefined && timeoutMs <= 0) throw timedOut();
  const frame = envelope(toBinary(method.input, create(method.input, input)));
  const headers: Record<string, string> = { ...opts.headers, "content-type": "application/grpc+proto", te: "trailers" };
  if (timeoutMs !== undefined) headers["grpc-timeout"] = `${Math.ceil(timeoutMs)}m`;
  let stream: ClientHttp2Stream;
  try {
    stream = await session.request("POST", `/${method.parent.typeName}/${method.name}`, headers, {});
  } catch (err) {
    throw fromNodeError(err);
  }
  return new Promise<MessageShape<O>>((resolve, reject) => {
    let settled = false;
    let head: IncomingHttpHeaders | undefined;
    let trailers: IncomingHttpHeaders | undefined;
    const chunks: Buffer[] = [];
    const timer = timeoutMs === undefined ? undefined : setTimeout(() => fail(timedOut()), timeoutMs);
    const onAbort = () => fail(ConnectError.from(signal!.reason, Code.Canceled));
    signal?.addEventListener("abort", onAbort, { once: true });
    const settle = () => {
      settled = true;
      if (timer) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    function fail(err: unknown) {
      if (settled) return;
      settle();
      if (!stream.closed) stream.close(constants.NGHTTP2_CANCEL);
      reject(err);
    }
    stream.on("response", (h) => {
      head = h;
      // The common answer (200, a gRPC content type, the status in the trailers) needs no checking here.
      if (h[":status"] === 200 && String(h["content-type"]).startsWith("application/grpc") && h["grpc-status"] === undefined && h["grpc-encoding"] === undefined) {
        opts.onHeader?.(h);
        return;
      }
      try {
        const { headerError } = validateResponse(h[":status"] ?? 0, webHeaders(h));
        if (headerError) throw headerError;
      } catch (err) {
        return fail(err);
      }
      opts.onHeader?.(h);
    });
    stream.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      session.notifyResponseByteRead(stream);
    });
    stream.on("trailers", (t) => (trailers = t));
    stream.on("error", (err) => fail(fromNodeError(err)));
    stream.on("close", () => {
      if (settled) return;
      if (!head) return fail(resetError(stream.rstCode) ?? new ConnectError("protocol error: missing response headers", Code.Internal));
      try {
        // A status in the headers (trailers-only) or the trailers, its details (grpc-status-details-bin) first.
        const t = trailers ?? {};
        if (!(t["grpc-status"] === "0" && t["grpc-status-details-bin"] === undefined && head["grpc-status"] === undefined)) {
          if (trailers === undefined && head["grpc-status"] === undefined) throw resetError(stream.rstCode) ?? new ConnectError("protocol error: missing status", Code.Internal);
          validateTrailer(webHeaders(t), webHeaders(head));
        }
        const data = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
        if (data.length < 5) throw new ConnectError("protocol error: missing output message for unary method", Code.Unimplemented);
        if (data[0] & 0b1) throw new ConnectError("protocol error: received compressed output message without an encoding", Code.Internal);
        const size = data.readUInt32BE(1);
        if (data.length < 5 + size) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
        if (data.length > 5 + size) throw new ConnectError("protocol error: received extra output message for unary method", Code.Unimplemented);
        let out: MessageShape<O>;
        try {
          out = fromBinary(method.output, data.subarray(5));
        } catch (err) {
          throw new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.Internal);
        }
        settle();
        resolve(out);
      } catch (err) {
        fail(err);
      }
    });
    stream.end(frame);
  });
}

function timedOut(): ConnectError {
  return new ConnectError("the operation timed out", Code.DeadlineExceeded);
}

function webHeaders(h: IncomingHttpHeaders): Headers {
  const out = new Headers();
  for (const [k, v] of Object.entries(h)) {
    if (k.startsWith(":") || v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [String(v)]) out.append(k, one);
  }
  return out;
}

/** The code of a stream reset by the agent's side (as Connect maps them; 0 and STREAM_CLOSED are none). */
function resetError(rstCode: number | undefined): ConnectError | undefined {
  const c = constants;
  const code =
    rstCode === c.NGHTTP2_REFUSED_STREAM ? Code.Unavailable
    : rstCode === c.NGHTTP2_CANCEL ? Code.Canceled
    : rstCode === c.NGHTTP2_ENHANCE_YOUR_CALM ? Code.ResourceExhausted
    : rstCode === c.NGHTTP2_INADEQUATE_SECURITY || rstCode === c.NGHTTP2_HTTP_1_1_REQUIRED ? Code.PermissionDenied
    : rstCode !== undefined && rstCode !== c.NGHTTP2_NO_ERROR && rstCode !== c.NGHTTP2_STREAM_CLOSED ? Code.Internal
    : undefined;
  return code === undefined ? undefined : new ConnectError(`http/2 stream closed with error code 0x${rstCode!.toString(16)}`, code);
}

/** A transport failure as Connect's node client reports it (connection refused: UNAVAILABLE, reset: ABORTED). */
function fromNodeError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const codes: string[] = [];
  for (let e: unknown = err; e instanceof Error && codes.length < 8; e = e.cause) if ("code" in e && typeof e.code === "string") codes.push(e.code);
  const code = codes.some((c) => c === "ERR_STREAM_DESTROYED" || c === "ERR_HTTP2_INVALID_STREAM" || c === "ECONNRESET")
    ? Code.Aborted
    : codes.some((c) => c === "ETIMEDOUT" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "ECONNREFUSED")
      ? Code.Unavailable
      : Code.Internal;
  const ce = ConnectError.from(err, code);
  if (ce !== err) ce.cause = err;
  return ce;
}
