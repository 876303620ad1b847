/**
 * Hand-framed gRPC beside Connect: the few calls where Connect's pipeline (async iterables,
 * envelope transforms, web Headers, linked signals, per-message copies) costs more CPU than the
 * call's own work. Everything else on the wire is Connect's.
 *
 * - client-unary.ts: control's unary calls to an agent (every toolbox exec) as one HTTP/2 stream,
 *   instead of Connect's client: 0.8-0.95 ms of control CPU per call against 0.30-0.38 ms for a
 *   bare stream on the same session (bench/toolbox/RESULTS.md, "Exec, in control").
 * - server-unary.ts (with the adapter rpc/grpc-unary.ts): plain unary gRPC calls of the toolbox on
 *   the control port without Connect's handler pipeline (about 1 ms of CPU per call). With the
 *   above: control CPU per exec REST 2.1 -> 1.4 ms, gRPC 2.5 -> 1.5 ms (bench/toolbox/control-cpu.ts).
 * - upload-frames.ts, upload-transport.ts: an upload's data messages to the agent framed by hand
 *   (no serialization, envelope and join copies) on connect-node's HTTP/2 client: control CPU per
 *   GiB uploaded 2.33 -> 1.55 s at 1 GiB (bench/toolbox/RESULTS.md, "Uploads").
 *
 * The protocol pieces these need (envelopes, grpc-status / grpc-message / grpc-status-details-bin,
 * grpc-timeout, a streaming call's abort and deadline: @sandbar/protocol/grpc-wire, shared with the agent, and streaming-call.ts)
 * are written here from the gRPC over HTTP/2 spec as Connect writes them, with Connect's public API
 * only: nothing imports Connect's internals (`@connectrpc/connect/protocol*`, not in its semver)
 * outside tests, so Connect is an ordinary caret dependency. wire.test.ts pins our bytes, trailers
 * and errors against Connect's own handler, client and protocol functions (rpc/grpc-unary.test.ts and
 * client-unary.test.ts compare whole calls with Connect's), so a Connect upgrade that changes
 * them fails there.
 */
export { agentUnary } from "./client-unary.ts";
export { encodeAnswer, isPlainUnary, readUnaryRequest, timeoutHeader, writeAnswer } from "./server-unary.ts";
export { asConnectError, parseTimeout, setTrailerStatus } from "@sandbar/protocol/grpc-wire";
export { createAgentTransport } from "./upload-transport.ts";
