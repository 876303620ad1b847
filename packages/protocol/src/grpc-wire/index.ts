// The gRPC over HTTP/2 wire both sides' hand-framed paths write and read (control's fast paths,
// the agent's direct transfers): envelopes and statuses, as Connect's gRPC protocol does them
// without its internals. packages/control/src/grpc-wire/wire.test.ts and
// packages/agent/src/grpc-wire/wire.test.ts compare them with Connect's own.
export { envelope, splitEnvelopes } from "./envelope.ts";
export { asConnectError, findStatusError, parseTimeout, setTrailerStatus, validateResponse, validateTrailer } from "./status.ts";
