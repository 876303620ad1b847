import { Code, ConnectError } from "@connectrpc/connect";

/** The error codes of the API (gRPC's, spelled as the Connect protocol spells them). */
export type ErrorCode =
  | "canceled"
  | "unknown"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "aborted"
  | "out_of_range"
  | "unimplemented"
  | "internal"
  | "unavailable"
  | "data_loss"
  | "unauthenticated";

// The server maps each code to one HTTP status the same way (packages/protocol/src/errors.ts).
const byCode: Record<Code, [ErrorCode, number]> = {
  [Code.Canceled]: ["canceled", 499],
  [Code.Unknown]: ["unknown", 500],
  [Code.InvalidArgument]: ["invalid_argument", 400],
  [Code.DeadlineExceeded]: ["deadline_exceeded", 408],
  [Code.NotFound]: ["not_found", 404],
  [Code.AlreadyExists]: ["already_exists", 409],
  [Code.PermissionDenied]: ["permission_denied", 403],
  [Code.ResourceExhausted]: ["resource_exhausted", 429],
  [Code.FailedPrecondition]: ["failed_precondition", 409],
  [Code.Aborted]: ["aborted", 409],
  [Code.OutOfRange]: ["out_of_range", 400],
  [Code.Unimplemented]: ["unimplemented", 501],
  [Code.Internal]: ["internal", 500],
  [Code.Unavailable]: ["unavailable", 503],
  [Code.DataLoss]: ["data_loss", 500],
  [Code.Unauthenticated]: ["unauthenticated", 401],
};

/** Every failure the SDK reports: the API's code, its message, and the HTTP status REST would answer. */
export class SandbarError extends Error {
  override name = "SandbarError";
  readonly code: ErrorCode;
  readonly status: number;
  /** Response metadata (headers and trailers) of a failed call, when the server answered. */
  readonly metadata: Headers;

  constructor(message: string, code: ErrorCode, status: number, opts: { metadata?: Headers; cause?: unknown } = {}) {
    super(message, { cause: opts.cause });
    this.code = code;
    this.status = status;
    this.metadata = opts.metadata ?? new Headers();
  }
}

export class NotFoundError extends SandbarError {
  override name = "NotFoundError";
}
export class UnauthenticatedError extends SandbarError {
  override name = "UnauthenticatedError";
}
export class PermissionDeniedError extends SandbarError {
  override name = "PermissionDeniedError";
}
export class InvalidArgumentError extends SandbarError {
  override name = "InvalidArgumentError";
}
/** A call's deadline passed (the `timeoutMs` option, an AbortSignal.timeout(), or the server's). */
export class TimeoutError extends SandbarError {
  override name = "TimeoutError";
}
/** The caller aborted the call with its AbortSignal. */
export class CanceledError extends SandbarError {
  override name = "CanceledError";
}
/** 429 / RESOURCE_EXHAUSTED; `retryAfter` is the server's Retry-After in seconds (undefined when it sent none). */
export class RateLimitedError extends SandbarError {
  override name = "RateLimitedError";
  readonly retryAfter: number | undefined;
  constructor(message: string, opts: { metadata?: Headers; cause?: unknown; retryAfter?: number } = {}) {
    super(message, "resource_exhausted", 429, opts);
    this.retryAfter = opts.retryAfter;
  }
}
/** Bad configuration found before any call: no credentials, a malformed URL or .env file. */
export class ConfigurationError extends SandbarError {
  override name = "ConfigurationError";
  constructor(message: string) {
    super(message, "invalid_argument", 400);
  }
}

/**
 * The HTTP status the server said an error stands for when its code's is not the one (a full disk:
 * RESOURCE_EXHAUSTED, but 400 over REST); undefined when it said none.
 */
export function statusOverride(metadata: Headers): number | undefined {
  const v = Number(metadata.get("x-sandbar-http-status") ?? "");
  return Number.isInteger(v) && v >= 400 && v < 600 ? v : undefined;
}

/** Seconds from a Retry-After value: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - now) / 1000));
}

/** Any failure of a call as a SandbarError subclass; SandbarErrors pass through unchanged. */
export function toSandbarError(err: unknown, signal?: AbortSignal): SandbarError {
  if (err instanceof SandbarError) return err;
  // An AbortSignal.timeout() aborts with a TimeoutError DOMException; Connect reports both as "canceled".
  if (signal?.aborted) {
    const reason: unknown = signal.reason;
    if (reason instanceof SandbarError) return reason;
    const timedOut = reason instanceof DOMException && reason.name === "TimeoutError";
    return timedOut
      ? new TimeoutError("The call timed out", "deadline_exceeded", 408, { cause: reason })
      : new CanceledError("The call was aborted", "canceled", 499, { cause: reason });
  }
  // A SandbarError thrown inside the transport (an interceptor) comes back wrapped by Connect.
  if (err instanceof ConnectError && err.cause instanceof SandbarError) return err.cause;
  const ce = ConnectError.from(err);
  const metadata = ce.metadata;
  const [code, byCodeStatus] = byCode[ce.code] ?? ["unknown", 500];
  const status = statusOverride(metadata) ?? byCodeStatus;
  const opts = { metadata, cause: err };
  const message = ce.rawMessage || ce.message;
  switch (ce.code) {
    case Code.NotFound:
      return new NotFoundError(message, code, status, opts);
    case Code.Unauthenticated:
      return new UnauthenticatedError(message, code, status, opts);
    case Code.PermissionDenied:
      return new PermissionDeniedError(message, code, status, opts);
    case Code.InvalidArgument:
      return new InvalidArgumentError(message, code, status, opts);
    case Code.DeadlineExceeded:
      return new TimeoutError(message, code, status, opts);
    case Code.Canceled:
      return new CanceledError(message, code, status, opts);
    case Code.ResourceExhausted:
      // A full disk is RESOURCE_EXHAUSTED too, answered 400 over REST: not a rate limit.
      if (status !== 429) return new SandbarError(message, code, status, opts);
      return new RateLimitedError(message, { ...opts, retryAfter: parseRetryAfter(metadata.get("retry-after")) });
    default:
      return new SandbarError(message, code, status, opts);
  }
}
