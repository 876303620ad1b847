import type { DescMessage, DescMethodStreaming, MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type ContextValues, type StreamResponse, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, createNodeHttpClient, type Http2SessionManager } from "@connectrpc/connect-node";
import { createMethodSerializationLookup, createMethodUrl, pipe, runStreamingCall, transformParseEnvelope, transformSplitEnvelope } from "@connectrpc/connect/protocol";
import { headerGrpcStatus, requestHeaderWithCompression, validateResponseWithCompression, validateTrailer } from "@connectrpc/connect/protocol-grpc";
import { budgeted, lostAnswer, noting, type SendBudget, type UploadProgress } from "./send-budget.ts";
import { framedDataField, uploadFrames } from "./upload-frames.ts";

const BASE_URL = "http://agent";

/** An empty gRPC message: the end of a complete upload (see the agent's UPLOAD_SEALED_HEADER). */
const SEAL = new Uint8Array(5);

function sealed(header: Headers): Headers {
  header.set("x-sandbar-upload-sealed", "1");
  return header;
}

/**
 * The gRPC transport to one agent: connect's, except that a client stream of file content
 * (`FileService.UploadFile`, `UploadFiles`) sends its data messages as frames written by hand
 * (uploadFrames: no serialization or envelope copies; an upload is CPU-bound, and those copies
 * were a third of control's JS time). The rest of that call is connect's own: its HTTP/2 client
 * on the same session (headers, abort and reset handling), its response and trailer validation,
 * its error mapping; the bytes on the wire are standard gRPC frames either way. Its pieces take
 * room in the connection's `budget` (send-budget.ts), and a call that ends without the agent's
 * answer says what is known of the file (lostAnswer) rather than the bare stream error.
 */
export function createAgentTransport(sessionManager: Http2SessionManager, budget: SendBudget): Transport {
  const connect = createGrpcTransport({ baseUrl: BASE_URL, sessionManager });
  const httpClient = createNodeHttpClient({ httpVersion: "2", sessionProvider: () => sessionManager });
  return {
    unary: (method, signal, timeoutMs, header, message, contextValues) => connect.unary(method, signal, timeoutMs, header, message, contextValues),
    stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      input: AsyncIterable<MessageInitShape<I>>,
      contextValues?: ContextValues,
    ): Promise<StreamResponse<I, O>> {
      const field = method.methodKind === "client_streaming" ? framedDataField(method.input) : undefined;
      if (!field) return connect.stream(method, signal, timeoutMs, header, input, contextValues);
      const serialization = createMethodSerializationLookup(method, undefined, undefined, { readMaxBytes: 0xffffffff, writeMaxBytes: 0xffffffff });
      timeoutMs = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      return runStreamingCall<I, O>({
        signal,
        timeoutMs,
        req: {
          stream: true,
          service: method.parent,
          method,
          requestMethod: "POST",
          url: createMethodUrl(BASE_URL, method),
          // No accepted compression: the one answer is a few bytes.
          header: sealed(requestHeaderWithCompression(true, timeoutMs, header, [], null)),
          contextValues: contextValues ?? createContextValues(),
          message: input,
        },
        next: async (req) => {
          const progress: UploadProgress = { files: 0, whole: false };
          const frames = uploadFrames(method.input, field, noting(req.message, field, progress));
          // The agent takes the upload as complete (and puts its files in place) only with the
          // empty message that ends a complete one: a cancelled call's stream may still end
          // cleanly (the input ends when the call is aborted; Node sends the end of stream
          // before its reset).
          const sealed = (async function* () {
            yield* frames;
            if (req.signal.aborted) throw ConnectError.from(req.signal.reason, Code.Canceled);
            yield SEAL;
          })();
          const body = budgeted(sealed, budget, progress);
          // A call that ends before the input does (the agent refused it, a reset): the input is
          // closed, so its source (the request body's parser) stops too.
          const closeInput = () => void body.return(undefined).catch(() => undefined);
          // Broken off without the agent's status (not the caller's own cancel or deadline).
          const unanswered = (err: unknown) => (req.signal.aborted ? err : lostAnswer(err, progress));
          let uRes;
          try {
            uRes = await httpClient({ url: req.url, method: "POST", header: req.header, signal: req.signal, body });
          } catch (err) {
            closeInput();
            throw unanswered(err);
          }
          const { foundStatus, headerError } = validateResponseWithCompression([], uRes.status, uRes.header);
          if (headerError) {
            closeInput();
            throw headerError;
          }
          const { trailer } = uRes;
          const message = pipe(uRes.body, transformSplitEnvelope(0xffffffff), transformParseEnvelope(serialization.getO(true)), async function* (messages) {
            try {
              try {
                yield* messages;
              } catch (err) {
                throw unanswered(err);
              }
              if (!foundStatus && !trailer.has(headerGrpcStatus)) throw unanswered(new Error("the stream ended without a status"));
              if (!foundStatus) validateTrailer(trailer, uRes.header);
            } finally {
              closeInput();
            }
          }, { propagateDownStreamError: true });
          return { ...req, header: uRes.header, trailer, message };
        },
      });
    },
  };
}
