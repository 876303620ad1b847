import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { Readable } from "node:stream";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ConfigService } from "@sandbar/protocol/gen/sandbar/control/v1/config_pb.js";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { SnapshotService } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import { parseRetryAfter, RateLimitedError, SandbarError, toSandbarError } from "./errors.ts";
import { isIdempotent, retryDelayMs } from "./retry.ts";
import { Sandbar, type SandbarClientOptions } from "./index.ts";
import { chunksOf, CHUNK_BYTES } from "./toolbox/chunks.ts";

// The transport against a stand-in gRPC server on a real h2c socket: the real control server
// cannot be made to answer UNAVAILABLE on demand, or to show the headers it received; this one
// fails as told and records what arrived. (Rate limits against the real server: limits.test.ts.)

let server: http2.Http2Server;
let url: string;
const seen: { method: string; authorization: string | null; organization: string | null }[] = [];
let failures: { code: Code; retryAfter?: string; httpStatus?: string }[] = [];

function next(method: string, header: Headers): void {
  seen.push({ method, authorization: header.get("authorization"), organization: header.get("x-sandbar-organization-id") });
  const f = failures.shift();
  const meta = { ...(f?.retryAfter ? { "retry-after": f.retryAfter } : {}), ...(f?.httpStatus ? { "x-sandbar-http-status": f.httpStatus } : {}) };
  if (f) throw new ConnectError("refused by the stand-in", f.code, meta);
}

beforeAll(async () => {
  const handler = connectNodeAdapter({
    grpc: true,
    connect: false,
    grpcWeb: false,
    routes(router) {
      router.service(ConfigService, {
        getConfig: (_req, ctx) => (next("getConfig", ctx.requestHeader), { version: "stand-in" }),
      });
      router.service(SandboxService, {
        getSandbox: (req, ctx) => (next("getSandbox", ctx.requestHeader), { id: req.sandboxId }),
        createSandbox: (_req, ctx) => (next("createSandbox", ctx.requestHeader), { id: "new" }),
      });
      router.service(SnapshotService, {
        async *getSnapshotBuildLogs(_req, ctx) {
          next("getSnapshotBuildLogs", ctx.requestHeader);
          yield { data: new TextEncoder().encode("a\nb") };
          yield { data: new TextEncoder().encode("c\nd\n") };
        },
      });
    },
  });
  server = http2.createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));
beforeEach(() => {
  seen.length = 0;
  failures = [];
});

const client = (o: SandbarClientOptions = {}) => new Sandbar({ apiUrl: url, apiKey: "k", env: {}, envFileDir: false, configDir: "/nonexistent", ...o });

describe("retries", () => {
  it("retries a read refused with UNAVAILABLE, with backoff, until it passes", async () => {
    failures = [{ code: Code.Unavailable }, { code: Code.Unavailable }];
    const delays: number[] = [];
    const c = client({ retry: { baseDelayMs: 20, onRetry: (i) => delays.push(i.delayMs) } });
    expect((await c.sandboxes.get("x")).id).toBe("x");
    expect(seen.map((s) => s.method)).toEqual(["getSandbox", "getSandbox", "getSandbox"]);
    expect(delays).toHaveLength(2);
    expect(delays[0]).toBeLessThanOrEqual(20);
    expect(delays[1]).toBeLessThanOrEqual(40);
    c.close();
  });

  it("gives up after maxAttempts with the last error", async () => {
    failures = Array.from({ length: 5 }, () => ({ code: Code.ResourceExhausted, retryAfter: "0" }));
    const c = client({ retry: { maxAttempts: 3 } });
    const err = await c.sandboxes.get("x").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RateLimitedError);
    expect((err as RateLimitedError).retryAfter).toBe(0);
    expect(seen).toHaveLength(3);
    c.close();
  });

  it("never retries a write, nor an error a retry cannot cure", async () => {
    failures = [{ code: Code.Unavailable }];
    const c = client({ retry: { baseDelayMs: 1 } });
    await expect(c.sandboxes.create({}, { wait: false })).rejects.toMatchObject({ code: "unavailable", status: 503 });
    failures = [{ code: Code.Internal }];
    await expect(c.sandboxes.get("x")).rejects.toMatchObject({ code: "internal", status: 500 });
    expect(seen.map((s) => s.method)).toEqual(["createSandbox", "getSandbox"]);
    c.close();
  });

  it("a full disk (RESOURCE_EXHAUSTED that the server says is a 400) is no rate limit: not retried, not RateLimitedError", async () => {
    failures = [{ code: Code.ResourceExhausted, httpStatus: "400" }];
    const c = client({ retry: { baseDelayMs: 1 } });
    const err = await c.sandboxes.get("x").catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(RateLimitedError);
    expect(err).toMatchObject({ code: "resource_exhausted", status: 400 });
    expect(seen).toHaveLength(1);
    c.close();
  });

  it("counts the wait against the call's deadline", async () => {
    // A wait of ten minutes, longer than the test may run: only the 300 ms deadline can end it.
    failures = [{ code: Code.ResourceExhausted, retryAfter: "600" }];
    const c = client({ retry: { maxRetryAfterMs: 3_600_000 } });
    await expect(c.sandboxes.get("x", { timeoutMs: 300 })).rejects.toMatchObject({ name: "TimeoutError" });
    expect(seen).toHaveLength(1);
    c.close();
  });

  it("marks reads idempotent by their GET binding", () => {
    const byName = (n: string) => SandboxService.methods.find((m) => m.name === n)!;
    expect(isIdempotent(byName("GetSandbox"))).toBe(true);
    expect(isIdempotent(byName("ListSandboxes"))).toBe(true);
    expect(isIdempotent(byName("CreateSandbox"))).toBe(false);
    expect(isIdempotent(byName("DeleteSandbox"))).toBe(false);
    expect(isIdempotent(byName("GetBuildLogs"))).toBe(false); // a stream
  });

  it("waits Retry-After (plus a little jitter) when the server sends it, else backs off exponentially under a cap", () => {
    const o = { maxAttempts: 4, baseDelayMs: 100, maxDelayMs: 1000, maxRetryAfterMs: 60_000 };
    const h = (v?: string) => new Headers(v === undefined ? {} : { "retry-after": v });
    expect(retryDelayMs(1, h("2"), o, () => 0)).toBe(2000);
    expect(retryDelayMs(1, h("2"), o, () => 0.999)).toBe(2099);
    expect(retryDelayMs(1, h("61"), o)).toBeUndefined();
    expect(retryDelayMs(1, h(), o, () => 0.999)).toBe(100);
    expect(retryDelayMs(3, h(), o, () => 0.999)).toBe(400);
    expect(retryDelayMs(9, h(), o, () => 0.999)).toBe(1000);
    expect(retryDelayMs(9, h(), o, () => 0)).toBe(1);
  });
});

describe("credentials", () => {
  it("sends an API key as bearer, without the organization header", async () => {
    const c = client({ organizationId: "org-1" });
    await c.sandboxes.get("x");
    expect(seen[0]).toMatchObject({ authorization: "Bearer k", organization: null });
    c.close();
  });

  it("sends a JWT with the organization header", async () => {
    const c = client({ apiKey: undefined, jwtToken: "jwt", organizationId: "org-1" });
    await c.sandboxes.get("x");
    expect(seen[0]).toMatchObject({ authorization: "Bearer jwt", organization: "org-1" });
    c.close();
  });

  it("asks a token provider before every attempt", async () => {
    let n = 0;
    failures = [{ code: Code.Unavailable }];
    const c = client({ apiKey: undefined, organizationId: "org-2", tokenProvider: async () => `fresh-${++n}`, retry: { baseDelayMs: 1 } });
    await c.sandboxes.get("x");
    expect(seen.map((s) => [s.authorization, s.organization])).toEqual([
      ["Bearer fresh-1", "org-2"],
      ["Bearer fresh-2", "org-2"],
    ]);
    c.close();
  });
});

describe("streams", () => {
  it("buildLogs() yields whole lines across chunk boundaries", async () => {
    const c = client();
    const lines: string[] = [];
    for await (const l of c.snapshots.buildLogs("s")) lines.push(l);
    expect(lines).toEqual(["a", "bc", "d"]);
    c.close();
  });

  it("a failing stream fails with a SandbarError", async () => {
    failures = [{ code: Code.NotFound }];
    const c = client();
    const err = await (async () => {
      for await (const _ of c.snapshots.buildLogs("s")) void _;
    })().catch((e: unknown) => e);
    expect(err).toMatchObject({ name: "NotFoundError", code: "not_found", status: 404 });
    c.close();
  });

  it("upload sources are cut into messages of at most CHUNK_BYTES, pulled lazily", async () => {
    const sizes = async (src: Parameters<typeof chunksOf>[0]) => {
      const out: number[] = [];
      for await (const c of chunksOf(src)) out.push(c.length);
      return out;
    };
    expect(await sizes(new Uint8Array(CHUNK_BYTES * 2 + 3))).toEqual([CHUNK_BYTES, CHUNK_BYTES, 3]);
    expect(await sizes("héllo")).toEqual([6]);
    expect(await sizes(new Blob([new Uint8Array(CHUNK_BYTES + 1)]).stream())).toEqual([CHUNK_BYTES, 1]);
    let pulled = 0;
    async function* endless() {
      for (;;) {
        pulled++;
        yield new Uint8Array(10);
      }
    }
    const it = chunksOf(endless());
    await it.next();
    await it.next();
    expect(pulled).toBe(2);
    await it.return(undefined);
    // A Node stream of strings (as one opened with an encoding yields) passes the types, not the check.
    await expect(sizes(Readable.from(["text"]))).rejects.toThrow(/Uint8Array chunks/);
  });
});

describe("errors", () => {
  it("reads Retry-After as seconds or an HTTP date", () => {
    expect(parseRetryAfter("7")).toBe(7);
    expect(parseRetryAfter(new Date(Date.now() + 3_000).toUTCString())).toBeGreaterThanOrEqual(2);
    expect(parseRetryAfter("soon")).toBeUndefined();
    expect(parseRetryAfter(null)).toBeUndefined();
  });

  it("maps each code to its class and REST status, and keeps SandbarErrors as they are", () => {
    const cases: [Code, string, number][] = [
      [Code.NotFound, "NotFoundError", 404],
      [Code.Unauthenticated, "UnauthenticatedError", 401],
      [Code.PermissionDenied, "PermissionDeniedError", 403],
      [Code.InvalidArgument, "InvalidArgumentError", 400],
      [Code.DeadlineExceeded, "TimeoutError", 408],
      [Code.ResourceExhausted, "RateLimitedError", 429],
      [Code.FailedPrecondition, "SandbarError", 409],
      [Code.Unavailable, "SandbarError", 503],
    ];
    for (const [code, name, status] of cases) {
      const e = toSandbarError(new ConnectError("m", code));
      expect([e.name, e.status, e.message]).toEqual([name, status, "m"]);
      expect(e).toBeInstanceOf(SandbarError);
    }
    const own = new SandbarError("x", "internal", 500);
    expect(toSandbarError(own)).toBe(own);
    expect(toSandbarError(new Error("boom")).code).toBe("unknown");
  });
});
