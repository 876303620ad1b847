import { asConnectError, Code, ConnectError } from "@sandbar/protocol";

/** Codes that answer 500: a fault of the server, never of the request. */
const SERVER_FAULTS = new Set([Code.Internal, Code.Unknown, Code.DataLoss]);

/** Failures already logged (the thrown value and the ConnectError it became). */
const logged = new WeakSet<object>();

/**
 * The one place unexpected failures are logged: anything thrown that is not a ConnectError, and
 * ConnectErrors that answer 500. A failure passes several layers (the guard's wrapper, the REST
 * gateway, the preview proxy): the first to see it logs it, the others find it logged. Returns
 * the ConnectError the caller gets (its text not leaked, see asConnectError).
 */
export function reportUnexpected(where: string, err: unknown): ConnectError {
  const e = asConnectError(err);
  if (logged.has(e) || (typeof err === "object" && err !== null && logged.has(err))) return e;
  if (!(err instanceof ConnectError) || SERVER_FAULTS.has(e.code)) console.error(`${where} failed:`, err);
  logged.add(e);
  if (typeof err === "object" && err !== null) logged.add(err);
  return e;
}
