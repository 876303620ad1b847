import { getOption, hasOption, type DescMethod } from "@bufbuild/protobuf";
import { MethodOptions_IdempotencyLevel } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { http } from "@sandbar/protocol/gen/google/api/annotations_pb.js";
import { parseRetryAfter, statusOverride } from "./errors.ts";

export interface RetryOptions {
  /** Attempts in all, the first included (default 4; 1 turns retries off). */
  maxAttempts?: number;
  /** First backoff (default 250 ms); each later one doubles, up to `maxDelayMs`, with full jitter. */
  baseDelayMs?: number;
  /** Longest backoff (default 10 s). */
  maxDelayMs?: number;
  /** Longest Retry-After honoured (default 60 s): a server asking for more fails the call at once. */
  maxRetryAfterMs?: number;
  /** Told before each wait, e.g. for a CLI to say why it pauses. */
  onRetry?: (info: RetryInfo) => void;
}

export interface RetryInfo {
  method: string;
  attempt: number;
  delayMs: number;
  code: Code;
}

/** Codes a retry may cure: rate limited (429) and unavailable (503). */
const RETRYABLE = new Set([Code.ResourceExhausted, Code.Unavailable]);

/**
 * Reads may be repeated; writes are not (a lost answer to a create must not create twice).
 * A method is a read when its proto says NO_SIDE_EFFECTS/IDEMPOTENT or its REST binding is a GET.
 */
export function isIdempotent(method: DescMethod): boolean {
  if (method.methodKind !== "unary") return false;
  if (method.idempotency !== MethodOptions_IdempotencyLevel.IDEMPOTENCY_UNKNOWN) return true;
  return hasOption(method, http) && getOption(method, http).pattern.case === "get";
}

/** The wait before retry number `attempt` (1-based): the server's Retry-After, else exponential backoff with full jitter. */
export function retryDelayMs(attempt: number, metadata: Headers, o: Required<Omit<RetryOptions, "onRetry">>, random = Math.random): number | undefined {
  const after = parseRetryAfter(metadata.get("retry-after"));
  if (after !== undefined) {
    const ms = after * 1000;
    // A little jitter on top, so clients refused together do not return together.
    return ms > o.maxRetryAfterMs ? undefined : ms + Math.floor(random() * Math.min(1000, o.baseDelayMs));
  }
  const cap = Math.min(o.maxDelayMs, o.baseDelayMs * 2 ** (attempt - 1));
  return Math.floor(random() * cap) + 1;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(ConnectError.from(signal.reason));
    const onAbort = () => {
      clearTimeout(timer);
      reject(ConnectError.from(signal.reason));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** Repeats idempotent unary calls refused with RESOURCE_EXHAUSTED or UNAVAILABLE; the call's deadline and signal bound the whole. */
export function retryInterceptor(options: RetryOptions = {}): Interceptor {
  const o = { maxAttempts: 4, baseDelayMs: 250, maxDelayMs: 10_000, maxRetryAfterMs: 60_000, ...options };
  return (next) => async (req) => {
    if (req.stream || o.maxAttempts <= 1 || !isIdempotent(req.method)) return next(req);
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(req);
      } catch (err) {
        const ce = ConnectError.from(err);
        // RESOURCE_EXHAUSTED that is no 429 (a full disk) stays so however often it is asked.
        const override = statusOverride(ce.metadata);
        if (attempt >= o.maxAttempts || !RETRYABLE.has(ce.code) || (override !== undefined && override !== 429) || req.signal.aborted) throw err;
        const delayMs = retryDelayMs(attempt, ce.metadata, o);
        if (delayMs === undefined) throw err;
        o.onRetry?.({ method: `${req.service.typeName}/${req.method.name}`, attempt, delayMs, code: ce.code });
        await sleep(delayMs, req.signal);
      }
    }
  };
}
