import { Code, ConnectError } from "@connectrpc/connect";

// Sandbar's one error type is ConnectError: services throw it with a Code and a
// message meant for the caller; the Code is mapped to an HTTP status here, once.
export { Code, ConnectError };

const httpStatusByCode: Record<Code, number> = {
  [Code.Canceled]: 499,
  [Code.Unknown]: 500,
  [Code.InvalidArgument]: 400,
  [Code.DeadlineExceeded]: 408,
  [Code.NotFound]: 404,
  [Code.AlreadyExists]: 409,
  [Code.PermissionDenied]: 403,
  [Code.ResourceExhausted]: 429,
  [Code.FailedPrecondition]: 409,
  [Code.Aborted]: 409,
  [Code.OutOfRange]: 400,
  [Code.Unimplemented]: 501,
  [Code.Internal]: 500,
  [Code.Unavailable]: 503,
  [Code.DataLoss]: 500,
  [Code.Unauthenticated]: 401,
};

export function httpStatusOf(code: Code): number {
  return httpStatusByCode[code] ?? 500;
}

const make = (code: Code) => (message: string) => new ConnectError(message, code);

/** Constructors for the errors services raise. */
export const errors = {
  invalidArgument: make(Code.InvalidArgument),
  unauthenticated: () => new ConnectError("Invalid credentials", Code.Unauthenticated),
  permissionDenied: make(Code.PermissionDenied),
  notFound: make(Code.NotFound),
  alreadyExists: make(Code.AlreadyExists),
  failedPrecondition: make(Code.FailedPrecondition),
  deadlineExceeded: make(Code.DeadlineExceeded),
  resourceExhausted: make(Code.ResourceExhausted),
  unimplemented: make(Code.Unimplemented),
  unavailable: make(Code.Unavailable),
  internal: make(Code.Internal),
};

/** Any thrown value as a ConnectError; unknown failures keep their cause but not their text. */
export function asConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  return new ConnectError("An unexpected error occurred.", Code.Internal, undefined, undefined, err);
}
