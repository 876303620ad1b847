import type { Http2ServerRequest } from "node:http2";
import { create, toBinary, type Message } from "@bufbuild/protobuf";
import { fileDesc, messageDesc, type GenMessage } from "@bufbuild/protobuf/codegenv2";
import { anyPack, file_google_protobuf_any, type Any } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, encodeBinaryHeader } from "@connectrpc/connect";

/**
 * What the direct transfer paths (upload.ts, download.ts) share: which requests they may take,
 * envelopes, and errors in gRPC trailers (grpc-status, percent-encoded grpc-message, grpc-status-details-bin:
 * a google.rpc.Status) as Connect's gRPC handler writes them (its setTrailerStatus, not in its
 * semver; wire.test.ts compares the two).
 */

/** A POST in plain gRPC, binary, uncompressed: the only kind the direct paths take (the rest is Connect's). */
export function isPlainGrpc(req: Http2ServerRequest): boolean {
  if (req.method !== "POST") return false;
  const type = req.headers["content-type"]?.toLowerCase();
  if (type !== "application/grpc" && type !== "application/grpc+proto") return false;
  const encoding = req.headers["grpc-encoding"];
  return encoding === undefined || encoding === "identity";
}

/** One uncompressed message in its gRPC envelope (flags byte, 4-byte big-endian length). */
export function envelope(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

type Status = Message<"google.rpc.Status"> & { code: number; message: string; details: Any[] };
let statusSchema: GenMessage<Status> | undefined;
/** google.rpc.Status, from the descriptor Connect embeds; built on the first error with details. */
function status(): GenMessage<Status> {
  return (statusSchema ??= messageDesc(
    fileDesc(
      "CgxzdGF0dXMucHJvdG8SCmdvb2dsZS5ycGMiTgoGU3RhdHVzEgwKBGNvZGUYASABKAUSDwoHbWVzc2FnZRgCIAEoCRIlCgdkZXRhaWxzGAMgAygLMhQuZ29vZ2xlLnByb3RvYnVmLkFueUJeCg5jb20uZ29vZ2xlLnJwY0ILU3RhdHVzUHJvdG9QAVo3Z29vZ2xlLmdvbGFuZy5vcmcvZ2VucHJvdG8vZ29vZ2xlYXBpcy9ycGMvc3RhdHVzO3N0YXR1c6ICA1JQQ2IGcHJvdG8z",
      [file_google_protobuf_any],
    ),
    0,
  ));
}

/** Headers the protocols own: an error's metadata never sets them (connect-go's protocolHeaders). */
const PROTOCOL_HEADERS = new Set([
  "content-type", "content-length", "content-encoding", "host", "user-agent", "trailer", "date",
  "accept-encoding", "trailer-", "connect-content-encoding", "connect-accept-encoding", "connect-timeout-ms", "connect-protocol-version",
  "grpc-encoding", "grpc-accept-encoding", "grpc-timeout", "grpc-status", "grpc-message", "grpc-status-details-bin",
]);

/** An error's gRPC trailers (`grpc-status`, `grpc-message`, details, its metadata), as Connect's gRPC handler makes them. */
export function errorTrailers(err: unknown): Record<string, string> {
  const e = err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err);
  const out = new Headers();
  // An error read from the wire relays its status and details, not the metadata it came with.
  if (!e.isWireError) e.metadata.forEach((value, key) => PROTOCOL_HEADERS.has(key.toLowerCase()) || out.append(key, value));
  out.set("grpc-status", e.code.toString(10));
  out.set("grpc-message", encodeURIComponent(e.rawMessage));
  if (e.details.length > 0) {
    const schema = status();
    const details = e.details.map((d) => ("desc" in d ? anyPack(d.desc, create(d.desc, d.value)) : { typeUrl: `type.googleapis.com/${d.type}`, value: d.value }));
    out.set("grpc-status-details-bin", encodeBinaryHeader(toBinary(schema, create(schema, { code: e.code, message: e.rawMessage, details }))));
  }
  return Object.fromEntries(out);
}
