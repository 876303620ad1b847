import { fromBinary, type DescMessage, type DescMethodStreaming, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type StreamResponse, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, createNodeHttpClient, type Http2SessionManager } from "@connectrpc/connect-node";
import { budgeted, lostAnswer, noting, type SendBudget, type UploadProgress } from "../toolbox/send-budget.ts";
import { splitEnvelopes, validateResponse, validateTrailer } from "@sandbar/protocol/grpc-wire";
import { streamingCall } from "./streaming-call.ts";
import { framedDataField, uploadFrames } from "./upload-frames.ts";

const BASE_URL = "http://agent";

/** An empty gRPC message: the end of a complete upload (see the agent's UPLOAD_SEALED_HEADER). */
const SEAL = new Uint8Array(5);

/**
 * The request headers Connect's gRPC client sends (binary, no compression offered: the one answer is
 * a few bytes), and the seal's announcement. The user agent is the one Connect 2.2 names itself by.
 */
function uploadHeaders(timeoutMs: number | undefined, header: ConstructorParameters<typeof Headers>[0]): Headers {
  const h = new Headers(header ?? {});
  h.set("content-type", "application/grpc+proto");
  if (!h.has("user-agent")) h.set("user-agent", "connect-es/2.2.0");
  if (timeoutMs !== undefined) h.set("grpc-timeout", `${timeoutMs}m`);
  h.set("te", "trailers");
  h.set("x-sandbar-upload-sealed", "1");
  return h;
}

/**
 * The gRPC transport to one agent: connect's, except that a client stream of file content
 * (`FileService.UploadFile`, `UploadFiles`) sends its data messages as frames written by hand
 * (uploadFrames: no serialization or envelope copies; an upload is CPU-bound, and those copies
 * were a third of control's JS time). The rest of that call is what connect's gRPC transport does
 * (streaming-call.ts: its abort and deadline handling; @sandbar/protocol/grpc-wire: its response and trailer
 * validation and error mapping), on connect-node's HTTP/2 client on the same session (headers,
 * abort and reset handling); the bytes on the wire are standard gRPC frames either way. Its
 * pieces take room in the connection's `budget` (send-budget.ts), and a call that ends without
 * the agent's answer says what is known of the file (lostAnswer) rather than the bare stream error.
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
      timeoutMs = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      const url = `${BASE_URL}/${method.parent.typeName}/${method.name}`;
      const requestHeader = uploadHeaders(timeoutMs, header);
      return streamingCall<I, O>(method, signal, timeoutMs, input, async (signal) => {
        const progress: UploadProgress = { files: 0, whole: false };
        const frames = uploadFrames(method.input, field, noting(input, field, progress));
        // The agent takes the upload as complete (and puts its files in place) only with the
        // empty message that ends a complete one: a cancelled call's stream may still end
        // cleanly (the input ends when the call is aborted; Node sends the end of stream
        // before its reset).
        const sealed = (async function* () {
          yield* frames;
          if (signal.aborted) throw ConnectError.from(signal.reason, Code.Canceled);
          yield SEAL;
        })();
        const body = budgeted(sealed, budget, progress);
        // A call that ends before the input does (the agent refused it, a reset): the input is
        // closed, so its source (the request body's parser) stops too.
        const closeInput = () => void body.return(undefined).catch(() => undefined);
        // Broken off without the agent's status (not the caller's own cancel or deadline).
        const unanswered = (err: unknown) => (signal.aborted ? err : lostAnswer(err, progress));
        let uRes;
        try {
          uRes = await httpClient({ url, method: "POST", header: requestHeader, signal, body });
        } catch (err) {
          closeInput();
          throw unanswered(err);
        }
        const { foundStatus, headerError } = validateResponse(uRes.status, uRes.header);
        if (headerError) {
          closeInput();
          throw headerError;
        }
        const { trailer } = uRes;
        const message = (async function* () {
          try {
            try {
              for await (const { flags, data } of splitEnvelopes(uRes.body)) yield parseOutput(method.output, flags, data);
            } catch (err) {
              throw unanswered(err);
            }
            if (!foundStatus && !trailer.has("grpc-status")) throw unanswered(new Error("the stream ended without a status"));
            if (!foundStatus) validateTrailer(trailer, uRes.header);
          } finally {
            closeInput();
          }
        })();
        return { header: uRes.header, trailer, message };
      });
    },
  };
}

/** An answer's message, as Connect's binary serialization reads it (no compression was offered). */
function parseOutput<O extends DescMessage>(schema: O, flags: number, data: Uint8Array): MessageShape<O> {
  if (flags & 0b1) throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
  try {
    return fromBinary(schema, data);
  } catch (err) {
    throw new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.Internal);
  }
}
