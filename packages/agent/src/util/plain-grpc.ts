import type { Http2ServerRequest } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";

/**
 * Support for the few calls the agent answers without Connect (large file
 * transfers, files/grpc-upload.ts and grpc-download.ts): which requests they
 * may take, and errors as Connect puts them in gRPC trailers.
 */

/** A POST in plain gRPC, binary, uncompressed: the only kind the direct paths take (the rest is Connect's). */
export function isPlainGrpc(req: Http2ServerRequest): boolean {
  if (req.method !== "POST") return false;
  const type = req.headers["content-type"]?.toLowerCase();
  if (type !== "application/grpc" && type !== "application/grpc+proto") return false;
  const encoding = req.headers["grpc-encoding"];
  return encoding === undefined || encoding === "identity";
}

/** An error's gRPC trailers (`grpc-status`, `grpc-message`, details), as Connect's gRPC handler makes them. */
export function errorTrailers(err: unknown): Record<string, string> {
  const e = err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err);
  return Object.fromEntries(setTrailerStatus(new Headers(), e));
}
