import type { DescMessage, DescMethodStreaming, MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type StreamResponse } from "@connectrpc/connect";

/**
 * A streaming call's life as Connect's transports run it (its protocol's runStreamingCall, not in
 * its semver): one signal for the call, aborted by the caller's signal, the deadline, a failure or
 * the answer's end; an abort ends the caller's input (throw, then return, on its iterator) and
 * fails the next read of the answer; every failure is a ConnectError (the abort's reason for an
 * aborted call). `run` sends the request and gives the answer (headers, messages, trailers).
 */
export function streamingCall<I extends DescMessage, O extends DescMessage>(
  method: DescMethodStreaming<I, O>,
  callerSignal: AbortSignal | undefined,
  timeoutMs: number | undefined,
  input: AsyncIterable<unknown>,
  run: (signal: AbortSignal) => Promise<{ header: Headers; trailer: Headers; message: AsyncIterable<MessageShape<O>> }>,
): Promise<StreamResponse<I, O>> {
  const deadline = new AbortController();
  const timer = timeoutMs === undefined ? undefined : setTimeout(() => deadline.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
  const controller = linked(callerSignal, deadline.signal);
  const signal = controller.signal;
  let doneCalled = false;
  signal.addEventListener("abort", function () {
    // The input is no longer read: its source stops (with the reason when the call failed).
    const it = input[Symbol.asyncIterator]();
    if (!doneCalled) it.throw?.(signal.reason).catch(() => undefined);
    it.return?.().catch(() => undefined);
  });
  const abort = (reason: unknown): Promise<never> => {
    const e = signal.aborted ? ConnectError.from(reasonOf(signal), Code.Canceled) : ConnectError.from(reason);
    controller.abort(e);
    clearTimeout(timer);
    return Promise.reject(e);
  };
  const done = () => {
    clearTimeout(timer);
    controller.abort();
  };
  return run(signal).then(
    (res) => ({
      stream: true as const,
      service: method.parent,
      method,
      header: res.header,
      trailer: res.trailer,
      message: {
        [Symbol.asyncIterator]() {
          const it = res.message[Symbol.asyncIterator]();
          return {
            next() {
              if (!doneCalled && signal.aborted) return abort(reasonOf(signal));
              return it.next().then((r) => {
                if (r.done === true) {
                  doneCalled = true;
                  done();
                }
                return r;
              }, abort);
            },
          };
        },
      },
    }),
    abort,
  );
}

/** A controller aborted with the reason of the first of the signals to abort. */
function linked(...signals: (AbortSignal | undefined)[]): AbortController {
  const controller = new AbortController();
  const all = signals.filter((s): s is AbortSignal => s !== undefined).concat(controller.signal);
  function onAbort(this: AbortSignal) {
    if (!controller.signal.aborted) controller.abort(reasonOf(this));
    for (const s of all) s.removeEventListener("abort", onAbort);
  }
  for (const s of all) {
    if (s.aborted) {
      onAbort.call(s);
      break;
    }
    s.addEventListener("abort", onAbort);
  }
  return controller;
}

function reasonOf(signal: AbortSignal): unknown {
  if (!signal.aborted) return undefined;
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error("This operation was aborted");
  e.name = "AbortError";
  return e;
}
