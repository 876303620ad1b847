import { create, fromBinary, toBinary, type Message } from "@bufbuild/protobuf";
import { fileDesc, messageDesc, type GenMessage } from "@bufbuild/protobuf/codegenv2";
import { anyPack, file_google_protobuf_any, type Any } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, decodeBinaryHeader, encodeBinaryHeader } from "@connectrpc/connect";

/**
 * gRPC statuses as the gRPC over HTTP/2 protocol puts them in headers and trailers (grpc-status,
 * percent-encoded grpc-message, grpc-status-details-bin: a google.rpc.Status), written and read
 * as Connect's gRPC protocol does (its protocol-grpc functions setTrailerStatus, findTrailerError,
 * validateResponse, validateTrailer, parseTimeout: not in its semver). wire.test.ts compares them
 * with Connect's own.
 */

/** google.rpc.Status, from the same descriptor Connect embeds (protobuf-es's public codegen API). */
const file_status = fileDesc(
  "CgxzdGF0dXMucHJvdG8SCmdvb2dsZS5ycGMiTgoGU3RhdHVzEgwKBGNvZGUYASABKAUSDwoHbWVzc2FnZRgCIAEoCRIlCgdkZXRhaWxzGAMgAygLMhQuZ29vZ2xlLnByb3RvYnVmLkFueUJeCg5jb20uZ29vZ2xlLnJwY0ILU3RhdHVzUHJvdG9QAVo3Z29vZ2xlLmdvbGFuZy5vcmcvZ2VucHJvdG8vZ29vZ2xlYXBpcy9ycGMvc3RhdHVzO3N0YXR1c6ICA1JQQ2IGcHJvdG8z",
  [file_google_protobuf_any],
);
type Status = Message<"google.rpc.Status"> & { code: number; message: string; details: Any[] };
const StatusSchema: GenMessage<Status> = messageDesc(file_status, 0);

const STATUS = "grpc-status";
const MESSAGE = "grpc-message";
const DETAILS = "grpc-status-details-bin";

/** Headers the protocols own: an error's metadata never sets them (connect-go's protocolHeaders). */
const PROTOCOL_HEADERS = new Set([
  "content-type", "content-length", "content-encoding", "host", "user-agent", "trailer", "date",
  "accept-encoding", "trailer-", "connect-content-encoding", "connect-accept-encoding", "connect-timeout-ms", "connect-protocol-version",
  "grpc-encoding", "grpc-accept-encoding", "grpc-timeout", STATUS, MESSAGE, DETAILS,
]);

/** Any failure as the error a gRPC caller is told: a ConnectError as it is, anything else an internal error. */
export function asConnectError(err: unknown): ConnectError {
  return err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err);
}

/** Writes a call's status into its trailers (or a trailers-only answer's headers): OK without an error. */
export function setTrailerStatus(target: Headers, error?: ConnectError): Headers {
  if (!error) {
    target.set(STATUS, "0");
    return target;
  }
  // An error read from the wire relays its status and details, not the metadata it came with.
  if (!error.isWireError) error.metadata.forEach((value, key) => PROTOCOL_HEADERS.has(key.toLowerCase()) || target.append(key, value));
  target.set(STATUS, error.code.toString(10));
  target.set(MESSAGE, encodeURIComponent(error.rawMessage));
  if (error.details.length > 0) {
    const status = create(StatusSchema, {
      code: error.code,
      message: error.rawMessage,
      details: error.details.map((d) => ("desc" in d ? anyPack(d.desc, create(d.desc, d.value)) : { typeUrl: `type.googleapis.com/${d.type}`, value: d.value })),
    });
    target.set(DETAILS, encodeBinaryHeader(toBinary(StatusSchema, status)));
  }
  return target;
}

/** The error status in a trailer (or a trailers-only answer's headers), details first; none for OK or no status. */
export function findStatusError(h: Headers): ConnectError | undefined {
  const details = h.get(DETAILS);
  if (details !== null) {
    const bytes = decodeBinaryHeader(details);
    let status;
    try {
      status = fromBinary(StatusSchema, bytes);
    } catch (err) {
      throw ConnectError.from(err, Code.DataLoss);
    }
    if (status.code === 0) return undefined;
    const error = new ConnectError(status.message, status.code, h);
    error.details = status.details.map((d) => ({ type: d.typeUrl.substring(d.typeUrl.lastIndexOf("/") + 1), value: d.value }));
    error.isWireError = true;
    return error;
  }
  const code = h.get(STATUS);
  if (code === null || code === "0") return undefined;
  const n = parseInt(code, 10);
  const error = n in Code
    ? new ConnectError(decodeURIComponent(h.get(MESSAGE) ?? ""), n, h)
    : new ConnectError(`invalid grpc-status: ${code}`, Code.Internal, h);
  error.isWireError = true;
  return error;
}

const GRPC_TYPE = /^application\/grpc(?:\+(?:(json)(?:; ?charset=utf-?8)?|proto))?$/i;

/**
 * Checks an answer's HTTP status, content type and encoding (none accepted: no call here asks for
 * compression). foundStatus: the status came in the headers (trailers-only), so no trailer follows.
 */
export function validateResponse(status: number, headers: Headers): { foundStatus: boolean; headerError?: ConnectError } {
  if (status !== 200) throw new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status), headers);
  const type = headers.get("content-type");
  if (!type || !GRPC_TYPE.test(type)) throw new ConnectError(`unsupported content type ${type}`, Code.Unknown);
  const result = { foundStatus: headers.has(STATUS), headerError: findStatusError(headers) };
  const encoding = headers.get("grpc-encoding");
  if (encoding !== null && encoding.toLowerCase() !== "identity") throw new ConnectError(`unsupported response encoding "${encoding}"`, Code.Internal, headers);
  return result;
}

/** Throws the trailer's error status (with the headers in its metadata), or a protocol error when neither has a status. */
export function validateTrailer(trailer: Headers, header: Headers): void {
  const err = findStatusError(trailer);
  if (err) {
    header.forEach((value, key) => err.metadata.append(key, value));
    throw err;
  }
  if (!header.has(STATUS) && !trailer.has(STATUS)) throw new ConnectError("protocol error: missing status", Code.Internal);
}

/** A gRPC code for an HTTP status other than 200 (grpc/doc/http-grpc-status-mapping.md). */
function codeFromHttpStatus(status: number): Code {
  switch (status) {
    case 400: return Code.Internal;
    case 401: return Code.Unauthenticated;
    case 403: return Code.PermissionDenied;
    case 404: return Code.Unimplemented;
    case 429: case 502: case 503: case 504: return Code.Unavailable;
    default: return Code.Unknown;
  }
}

const TIMEOUT_UNIT_MS: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 0.001, n: 0.000001 };

/** The grpc-timeout header (up to 8 digits and a unit) in ms; an error for a malformed one or one past maxMs. */
export function parseTimeout(value: string | null, maxMs: number): { timeoutMs?: number; error?: ConnectError } {
  if (value === null) return {};
  const m = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (!m) return { error: new ConnectError(`protocol error: invalid grpc timeout value: ${value}`, Code.InvalidArgument) };
  const timeoutMs = TIMEOUT_UNIT_MS[m[2]] * parseInt(m[1]);
  if (timeoutMs > maxMs) return { timeoutMs, error: new ConnectError(`timeout ${timeoutMs}ms must be <= ${maxMs}`, Code.InvalidArgument) };
  return { timeoutMs };
}
