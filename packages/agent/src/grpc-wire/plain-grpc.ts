import type { Http2ServerRequest } from "node:http2";
import { asConnectError, setTrailerStatus } from "@sandbar/protocol/grpc-wire";

export { envelope } from "@sandbar/protocol/grpc-wire";

/**
 * What the direct transfer paths (upload.ts, download.ts) share: which requests they may take,
 * envelopes, and errors in gRPC trailers (grpc-status, percent-encoded grpc-message, grpc-status-details-bin:
 * a google.rpc.Status), written by the protocol package's grpc-wire as control's fast paths write
 * them (wire.test.ts compares them with Connect's gRPC handler).
 */

/** A POST in plain gRPC, binary, uncompressed: the only kind the direct paths take (the rest is Connect's). */
export function isPlainGrpc(req: Http2ServerRequest): boolean {
  if (req.method !== "POST") return false;
  const type = req.headers["content-type"]?.toLowerCase();
  if (type !== "application/grpc" && type !== "application/grpc+proto") return false;
  const encoding = req.headers["grpc-encoding"];
  return encoding === undefined || encoding === "identity";
}

/** An error's gRPC trailers (`grpc-status`, `grpc-message`, details, its metadata), as Connect's gRPC handler makes them. */
export function errorTrailers(err: unknown): Record<string, string> {
  return Object.fromEntries(setTrailerStatus(new Headers(), asConnectError(err)));
}
