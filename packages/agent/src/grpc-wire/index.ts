/**
 * Hand-framed gRPC beside Connect in the agent: the large file transfers, where Connect's
 * per-message pipeline (whole-message envelope reads, protobuf writer and envelope copies, async
 * iterables per message) cost more CPU than moving the bytes. Plain-gRPC `UploadFile` /
 * `UploadFiles` are decoded straight from the HTTP/2 stream (upload.ts: data written as slices of
 * the socket reads) and `DownloadFile` chunks are read from the file into their own envelopes
 * (download.ts): sandbox CPU per GiB upload 2.14 -> 1.55 s, download 1.40 -> 0.93 s
 * (bench/toolbox/RESULTS.md, "Uploads"; bench/agent/transfer-cpu.ts measures the agent alone).
 * Other protocols (Connect, gRPC-web) and compressed calls stay Connect's.
 *
 * lean-headers.ts, the WHATWG Headers the bundle gives Connect instead of Node's (which loads
 * undici: 15-30 ms of an agent's first call, bench/agent/NOTES.md), lives here too: the other
 * piece the agent keeps beside Connect. build.ts injects it; nothing imports it.
 *
 * Statuses are written as Connect's gRPC handler writes them, with Connect's public API only
 * (plain-grpc.ts): no Connect internals here or elsewhere in the agent. wire.test.ts pins the
 * envelopes, trailers and error mapping against a Connect server's answers, so a Connect upgrade
 * that changes them fails there. This module is loaded on the first transfer (rpc.ts).
 */
export { isDirectDownload, serveDirectDownload } from "./download.ts";
export { isDirectUpload, serveDirectUpload } from "./upload.ts";
