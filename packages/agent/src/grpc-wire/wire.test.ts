import http2 from "node:http2";
import { mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
// Connect's own protocol functions, the reference (here only: not in Connect's semver).
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { errors } from "@sandbar/protocol";
import { DownloadFileRequestSchema, FileService, UploadFileRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { GetVersionResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { serveDirectDownload } from "./download.ts";
import { envelope, errorTrailers } from "./plain-grpc.ts";
import { serveDirectUpload } from "./upload.ts";

// The agent's direct transfers against Connect's gRPC handler: the trailers they write for an
// error, their envelopes, and whole answers to the same refused calls, so that a Connect upgrade
// that changes what its handler writes fails here. (transfer.test.ts checks the files and the
// download's messages against the protocol on a real agent process.)

const ERRORS: Record<string, () => unknown> = {
  plain: () => errors.unauthenticated(),
  encoded: () => new ConnectError("no such file: ünïcode 100% / %20\n\"quoted\"", Code.NotFound),
  metadata: () => new ConnectError("no space left on device: /w/a", Code.ResourceExhausted, { "x-sandbar-http-status": "400", "grpc-message": "x", "content-type": "text/plain" }),
  details: () => new ConnectError("refused", Code.FailedPrecondition, undefined, [{ desc: GetVersionResponseSchema, value: { version: "é" } }]),
  wire: () => Object.assign(new ConnectError("relayed", Code.Unavailable, { "x-from-wire": "dropped" }), { isWireError: true }),
  internal: () => new Error("a bug's message stays inside"),
};

/** A call's answer as received: status, headers and trailers (no date), and the body. */
interface Received {
  status: number;
  headers: [string, string][];
  trailers: [string, string][];
  body: Buffer;
}

let dir: string;
let server: http2.Http2Server;
let url: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "agent-wire-"));
  const fail = (name: string) => {
    throw ERRORS[name]();
  };
  // Connect's handler throws the error named by x-error; with x-direct, the direct paths answer.
  const connect = connectNodeAdapter({
    routes: (r) =>
      r.service(FileService, {
        async *downloadFile(_req, ctx) {
          fail(ctx.requestHeader.get("x-error") ?? "");
        },
        async uploadFile(_req, ctx) {
          return fail(ctx.requestHeader.get("x-error") ?? "");
        },
      }),
  });
  server = http2.createServer((req, res) => {
    if (req.headers["x-direct"] === undefined) return connect(req, res);
    const opts = { authorized: () => req.headers["x-error"] !== "plain", resolve: (p: string) => path.join(dir, p), readMaxBytes: 1 << 20 };
    if (req.url.endsWith("/DownloadFile")) void serveDirectDownload(req, res, opts);
    else void serveDirectUpload(req, res, opts);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server.close(r));
  await rm(dir, { recursive: true, force: true });
});

async function call(method: string, body: Uint8Array, headers: Record<string, string>): Promise<Received> {
  const session = http2.connect(url);
  try {
    const stream = session.request({ ":method": "POST", ":path": `/sandbar.agent.v1.FileService/${method}`, "content-type": "application/grpc+proto", te: "trailers", ...headers });
    stream.end(body);
    const out: Received = { status: 0, headers: [], trailers: [], body: Buffer.alloc(0) };
    const list = (h: http2.IncomingHttpHeaders) => Object.entries(h).filter(([k]) => !k.startsWith(":") && k !== "date").map(([k, v]): [string, string] => [k, String(v)]).sort();
    stream.on("response", (h) => ((out.status = Number(h[":status"])), (out.headers = list(h))));
    stream.on("trailers", (t) => (out.trailers = list(t)));
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    await new Promise((r) => stream.on("close", r));
    out.body = Buffer.concat(chunks);
    return out;
  } finally {
    session.close();
  }
}

const download = envelope(toBinary(DownloadFileRequestSchema, create(DownloadFileRequestSchema, { path: "missing" })));
const upload = envelope(toBinary(UploadFileRequestSchema, create(UploadFileRequestSchema, { part: { case: "header", value: { path: "a" } } })));

describe("error trailers", () => {
  for (const name of Object.keys(ERRORS)) {
    it(`${name}: what Connect's gRPC handler writes for the same error`, async () => {
      const ours = Object.entries(errorTrailers(ERRORS[name]())).sort();
      const byHandler = await call("DownloadFile", download, { "x-error": name });
      // Connect answers a server stream's error in the trailers after its headers, as the direct paths do.
      expect(byHandler.trailers).toEqual(ours);
      const err = ERRORS[name]();
      const asConnect = err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err);
      expect(ours).toEqual([...setTrailerStatus(new Headers(), asConnect).entries()].sort());
    });
  }
});

describe("whole answers beside Connect's", () => {
  it("a refused download: the same status, headers, body and trailers", async () => {
    const direct = await call("DownloadFile", download, { "x-direct": "1", "x-error": "plain" });
    const byHandler = await call("DownloadFile", download, { "x-error": "plain" });
    expect(direct).toEqual(byHandler);
  });

  it("a refused upload: the same status, headers, body and trailers", async () => {
    const direct = await call("UploadFile", upload, { "x-direct": "1", "x-error": "plain" });
    const byHandler = await call("UploadFile", upload, { "x-error": "plain" });
    expect(direct).toEqual(byHandler);
  });

  it("a download of a missing file answers NOT_FOUND in the trailers", async () => {
    const direct = await call("DownloadFile", download, { "x-direct": "1" });
    expect(direct.status).toBe(200);
    expect(Object.fromEntries(direct.trailers)["grpc-status"]).toBe(String(Code.NotFound));
  });
});

describe("envelopes", () => {
  it("are Connect's bytes for messages of every length width", () => {
    for (const n of [0, 1, 127, 128, 65_535, 65_536, 1 << 20]) {
      const msg = new Uint8Array(n).fill(n & 0xff);
      expect(Buffer.compare(envelope(msg), encodeEnvelope(0, msg)), String(n)).toBe(0);
    }
  });
});
