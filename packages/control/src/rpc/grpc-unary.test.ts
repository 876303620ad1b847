import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type HandlerContext } from "@connectrpc/connect";
import { compressionGzip, connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import { type ExecuteRequest, ExecuteResponseSchema, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { grpcUnaryFastPath } from "./grpc-unary.ts";

// The fast path beside Connect's own handler, on one real HTTP/2 server and the same
// implementation: plain calls go to the fast path (counted), calls whose request is compressed go
// to Connect. Every answer, error and header must come out the same both ways. The control
// server's wiring (toolbox services, the guard) is covered end to end by test/toolbox-forwarding,
// test/tenancy (NotFound on every RPC over gRPC) and test/sdk.

const seen = new Map<string, { timeoutMs?: number; aborted?: unknown }>();
const BIG = "y".repeat(2 * 1024 * 1024);

async function execute(req: { command: string }, ctx: HandlerContext) {
  const note = { timeoutMs: ctx.timeoutMs() } as { timeoutMs?: number; aborted?: unknown };
  seen.set(req.command, note);
  ctx.signal.addEventListener("abort", () => (note.aborted = ctx.signal.reason));
  switch (req.command) {
    case "ok":
      ctx.responseHeader.set("x-ratelimit-remaining", "41");
      return { exitCode: 7, result: `sandbox ${ctx.requestHeader.get("x-sandbar-sandbox-id")}` };
    case "big":
      return create(ExecuteResponseSchema, { result: BIG });
    case "refused":
      ctx.responseHeader.set("x-ratelimit-remaining", "0");
      throw new ConnectError("Too many requests: ü 50%", Code.ResourceExhausted, { "retry-after": "3" });
    case "details":
      throw new ConnectError("bad", Code.FailedPrecondition, undefined, [{ desc: ExecuteResponseSchema, value: { exitCode: 2 } }]);
    case "bug":
      throw new Error("secret internals");
    case "wait":
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      throw ctx.signal.reason;
    default:
      return { exitCode: 0 };
  }
}

let server: http2.Http2Server;
let url: string;
let fast = 0;
const sessions = new Set<http2.ServerHttp2Session>();

beforeAll(async () => {
  const impl = { execute };
  const connect = connectNodeAdapter({ readMaxBytes: 1024 * 1024, routes: (r) => r.service(ProcessService, impl) });
  const serve = grpcUnaryFastPath([ProcessService], async (ctx, input) => create(ExecuteResponseSchema, await execute(input as ExecuteRequest, ctx)), 1024 * 1024);
  server = http2.createServer((req, res) => {
    if (serve(req, res)) fast++;
    else connect(req, res);
  });
  server.on("session", (s) => sessions.add(s));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const s of sessions) s.destroy();
  await new Promise((r) => server.close(r));
});

const plain = () => createClient(ProcessService, createGrpcTransport({ baseUrl: url }));
const viaConnect = () => createClient(ProcessService, createGrpcTransport({ baseUrl: url, sendCompression: compressionGzip, compressMinBytes: 1 }));
const failure = (p: Promise<unknown>) => p.then(() => { throw new Error("expected a failure"); }, (e: unknown) => ConnectError.from(e));

/** Runs `call` both ways; the fast path must have taken exactly the plain one. */
async function both<T>(call: (c: ReturnType<typeof plain>) => Promise<T>): Promise<[T, T]> {
  const before = fast;
  const a = await call(plain());
  expect(fast, "the plain call took the fast path").toBe(before + 1);
  const b = await call(viaConnect());
  expect(fast, "the compressed call went to Connect").toBe(before + 1);
  return [a, b];
}

describe("grpcUnaryFastPath", () => {
  it("answers as Connect does, with the implementation's headers", async () => {
    const [a, b] = await both(async (c) => {
      const headers: Record<string, string> = {};
      const out = await c.execute({ command: "ok" }, { headers: { "x-sandbar-sandbox-id": "sb-1" }, onHeader: (h) => h.forEach((v, k) => (headers[k] = v)) });
      return { out, headers };
    });
    expect(a.out.exitCode).toBe(7);
    expect(a.out.result).toBe("sandbox sb-1");
    expect(a.out).toEqual(b.out);
    expect(a.headers["x-ratelimit-remaining"]).toBe("41");
    expect(a.headers["content-type"]).toBe(b.headers["content-type"]);
  });

  it("carries a large answer", async () => {
    const [a] = await both((c) => c.execute({ command: "big" }));
    expect(a.result === BIG).toBe(true);
  });

  it("raises an implementation's error with its message, code and metadata, as Connect does", async () => {
    const [a, b] = await both(async (c) => {
      const headers: Record<string, string> = {};
      const err = await failure(c.execute({ command: "refused" }, { onHeader: (h) => h.forEach((v, k) => (headers[k] = v)) }));
      return { err, headers };
    });
    expect(a.err.code).toBe(Code.ResourceExhausted);
    expect(a.err.rawMessage).toBe("Too many requests: ü 50%");
    expect(a.err.rawMessage).toBe(b.err.rawMessage);
    expect(a.err.metadata.get("retry-after")).toBe("3");
    expect(a.err.metadata.get("retry-after")).toBe(b.err.metadata.get("retry-after"));
    expect(a.err.metadata.get("x-ratelimit-remaining")).toBe(b.err.metadata.get("x-ratelimit-remaining"));
  });

  it("keeps error details, and hides an unexpected failure's text", async () => {
    const [a, b] = await both((c) => failure(c.execute({ command: "details" })));
    expect(a.code).toBe(Code.FailedPrecondition);
    expect(a.details).toEqual(b.details);
    expect(a.details.length).toBe(1);
    const [x, y] = await both((c) => failure(c.execute({ command: "bug" })));
    expect(x.code).toBe(Code.Internal);
    expect(x.rawMessage).toBe(y.rawMessage);
    expect(x.rawMessage).not.toContain("secret");
  });

  it("hands the caller's deadline to the implementation and ends the call at it", async () => {
    const [a, b] = await both((c) => failure(c.execute({ command: "wait" }, { timeoutMs: 200 })));
    expect(a.code).toBe(Code.DeadlineExceeded);
    expect(b.code).toBe(Code.DeadlineExceeded);
    const note = seen.get("wait")!;
    expect(note.timeoutMs).toBeGreaterThan(100);
    expect(note.timeoutMs).toBeLessThanOrEqual(200);
    await expect.poll(() => note.aborted).toBeDefined();
  });

  it("aborts the implementation's signal when the caller goes away", async () => {
    seen.delete("wait");
    const abort = new AbortController();
    const call = failure(plain().execute({ command: "wait" }, { signal: abort.signal }));
    await expect.poll(() => seen.has("wait")).toBe(true);
    abort.abort();
    expect((await call).code).toBe(Code.Canceled);
    await expect.poll(() => seen.get("wait")?.aborted !== undefined).toBe(true);
  });

  it("refuses a message over the read limit with RESOURCE_EXHAUSTED, as Connect does", async () => {
    const [a, b] = await both((c) => failure(c.execute({ command: "#".repeat(1024 * 1024 + 1) })));
    expect(a.code).toBe(Code.ResourceExhausted);
    expect(b.code).toBe(Code.ResourceExhausted);
    // The connection serves the next call.
    expect((await plain().execute({ command: "ok" })).exitCode).toBe(7);
  });

  it("survives a stream reset halfway through its message, and calls nothing", async () => {
    seen.clear();
    const before = fast;
    const session = http2.connect(url);
    const stream = session.request({ ":method": "POST", ":path": "/sandbar.agent.v1.ProcessService/Execute", "content-type": "application/grpc" });
    const prefix = Buffer.from([0, 0, 0, 0, 100]);
    stream.write(Buffer.concat([prefix, Buffer.alloc(10, 1)]));
    await expect.poll(() => fast).toBe(before + 1);
    await new Promise<void>((resolve) => stream.close(http2.constants.NGHTTP2_CANCEL, resolve));
    session.close();
    expect(seen.size).toBe(0);
    expect((await plain().execute({ command: "ok" })).exitCode).toBe(7);
  });

  it("refuses a truncated or doubled message as Connect does", async () => {
    const raw = async (body: Buffer, encoding?: string) => {
      const session = http2.connect(url);
      try {
        const stream = session.request({ ":method": "POST", ":path": "/sandbar.agent.v1.ProcessService/Execute", "content-type": "application/grpc", ...(encoding ? { "grpc-encoding": encoding } : {}) });
        const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.on("trailers", resolve));
        stream.resume();
        stream.end(body);
        return await trailers;
      } finally {
        session.close();
      }
    };
    const one = Buffer.from([0, 0, 0, 0, 4, 0x0a, 0x02, 0x6f, 0x6b]); // command: "ok"
    expect((await raw(one))["grpc-status"]).toBe("0");
    expect((await raw(one.subarray(0, 7)))["grpc-status"]).toBe(String(Code.InvalidArgument));
    expect((await raw(Buffer.concat([one, one])))["grpc-status"]).toBe(String(Code.Unimplemented));
    expect((await raw(Buffer.alloc(0)))["grpc-status"]).toBe(String(Code.Unimplemented));
    // Connect's answers to the same bodies (a gzip request goes to Connect; these envelopes are not compressed).
    const before = fast;
    for (const body of [one, one.subarray(0, 7), Buffer.concat([one, one]), Buffer.alloc(0)]) {
      expect((await raw(body, "gzip"))["grpc-status"]).toBe((await raw(body))["grpc-status"]);
    }
    expect(fast).toBe(before + 4);
  });

  it("leaves other protocols and compressed requests to Connect", async () => {
    const before = fast;
    const { createConnectTransport } = await import("@connectrpc/connect-node");
    const c = createClient(ProcessService, createConnectTransport({ baseUrl: url, httpVersion: "2" }));
    expect((await c.execute({ command: "ok" })).exitCode).toBe(7);
    expect((await viaConnect().execute({ command: "ok" })).exitCode).toBe(7);
    expect(fast).toBe(before);
  });
});
