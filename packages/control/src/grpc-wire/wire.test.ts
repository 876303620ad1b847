import http2 from "node:http2";
import { connect as netConnect, type AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter, createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
// Connect's own gRPC protocol functions, the reference (here only: not in Connect's semver).
import * as ref from "@connectrpc/connect/protocol-grpc";
import { FileService, UploadFileRequestSchema, UploadFileResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { ExecuteResponseSchema, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { SendBudget } from "../toolbox/send-budget.ts";
import { agentUnary } from "./client-unary.ts";
import { asConnectError, envelope, findStatusError, parseTimeout, setTrailerStatus, splitEnvelopes, validateResponse, validateTrailer } from "@sandbar/protocol/grpc-wire";
import { createAgentTransport } from "./upload-transport.ts";

// The wire of grpc-wire against Connect's: what our framing writes and reads must be what Connect
// writes and reads, so that a Connect upgrade that changes either fails here. Three ways: a Connect
// server's trailers beside ours for the same errors; a raw HTTP/2 server answering every shape of
// gRPC answer (good, errors, details, trailers-only, malformed) to Connect's client and to ours;
// Connect's protocol functions beside ours on the same inputs.

const MESSAGE = "no such thing: ünïcode 100% / %20\n\"quoted\"";
/** Errors as implementations raise them: what their trailers say is the protocol's job. */
const ERRORS: Record<string, () => unknown> = {
  plain: () => new ConnectError("refused", Code.PermissionDenied),
  encoded: () => new ConnectError(MESSAGE, Code.NotFound),
  metadata: () => new ConnectError("full", Code.ResourceExhausted, { "x-sandbar-http-status": "400", "grpc-status": "1", "content-type": "text/plain", "x-two": ["a", "b"] }),
  details: () => new ConnectError("refused", Code.FailedPrecondition, undefined, [{ desc: ExecuteResponseSchema, value: { exitCode: 9, result: "é" } }]),
  rawDetails: () => Object.assign(new ConnectError("refused", Code.Aborted), { details: [{ type: "sandbar.x.Y", value: new Uint8Array([1, 2, 3]) }] }),
  wire: () => Object.assign(new ConnectError("relayed", Code.Unavailable, { "x-from-wire": "dropped" }), { isWireError: true }),
  internal: () => new Error("a bug's message stays inside"),
  empty: () => new ConnectError("", Code.Unknown),
};

const headersOf = (h: Headers) => [...h.entries()].filter(([k]) => k !== "date").sort();
const failure = (p: Promise<unknown>) => p.then((v) => ({ ok: v }), (e: unknown) => ({ err: e }));

/** An outcome as a caller sees it: the message, or the error's code, message, metadata and details. */
function outcome(r: { ok: unknown } | { err: unknown }) {
  if ("ok" in r) return { ok: r.ok };
  const e = ConnectError.from(r.err);
  return { code: e.code, message: e.rawMessage, metadata: headersOf(e.metadata), details: e.details };
}

describe("trailers written for an error", () => {
  let server: http2.Http2Server;
  let url: string;
  beforeAll(async () => {
    const execute = (req: { command: string }, ctx: HandlerContext) => {
      if (req.command === "timeout") return { exitCode: ctx.timeoutMs() === undefined ? -1 : 1 };
      throw ERRORS[req.command]();
    };
    server = http2.createServer(connectNodeAdapter({ routes: (r) => r.service(ProcessService, { execute }) }));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise((r) => server.close(r)));

  /** The raw trailers (or trailers-only headers) Connect's gRPC handler answers a call with. */
  async function connectTrailers(command: string, extra: Record<string, string> = {}): Promise<Headers> {
    const session = http2.connect(url);
    try {
      const stream = session.request({ ":method": "POST", ":path": "/sandbar.agent.v1.ProcessService/Execute", "content-type": "application/grpc+proto", te: "trailers", ...extra });
      stream.end(envelope(toBinary(ProcessService.method.execute.input, create(ProcessService.method.execute.input, { command }))));
      const out = new Headers();
      const add = (h: http2.IncomingHttpHeaders) => {
        for (const [k, v] of Object.entries(h)) if (!k.startsWith(":") && k !== "content-type" && k !== "date" && v !== undefined) out.append(k, String(v));
      };
      stream.on("response", add);
      stream.on("trailers", add);
      stream.resume();
      await new Promise((r) => stream.on("close", r));
      return out;
    } finally {
      session.close();
    }
  }

  for (const name of Object.keys(ERRORS)) {
    it(`${name}: the same grpc-status, grpc-message, grpc-status-details-bin and metadata as Connect's handler`, async () => {
      const ours = setTrailerStatus(new Headers(), asConnectError(ERRORS[name]()));
      expect(headersOf(ours)).toEqual(headersOf(await connectTrailers(name)));
      expect(headersOf(ours)).toEqual(headersOf(ref.setTrailerStatus(new Headers(), asConnectError(ERRORS[name]()))));
    });
  }

  it("reads grpc-timeout as Connect does", async () => {
    for (const value of ["1S", "250m", "99999999n", "3H", "12u", "1M", "0m", "123456789m", "1x", "-1m", "", " 1m", "1.5S"]) {
      expect(parseTimeout(value, Number.MAX_SAFE_INTEGER), value).toEqual(ref.parseTimeout(value, Number.MAX_SAFE_INTEGER));
      expect(parseTimeout(value, 1000), value).toEqual(ref.parseTimeout(value, 1000));
    }
    expect(parseTimeout(null, 1)).toEqual(ref.parseTimeout(null, 1));
    // Connect's handler refuses a malformed one with the error parseTimeout gives.
    const bad = await connectTrailers("timeout", { "grpc-timeout": "1x" });
    expect(bad.get("grpc-status")).toBe(String(Code.InvalidArgument));
    expect(decodeURIComponent(bad.get("grpc-message") ?? "")).toBe(parseTimeout("1x", Number.MAX_SAFE_INTEGER).error?.rawMessage);
  });
});

/** An answer the raw server gives: HTTP status and headers, messages, trailers (none: trailers-only or none at all). */
interface Answer {
  status?: number;
  headers?: Record<string, string>;
  messages?: Uint8Array[];
  trailers?: Record<string, string>;
}
const GRPC = { "content-type": "application/grpc+proto" };
const statusBin = (err: ConnectError) => ref.setTrailerStatus(new Headers(), err).get("grpc-status-details-bin") ?? "";
const executeOut = toBinary(ExecuteResponseSchema, create(ExecuteResponseSchema, { exitCode: 3, result: "héllo" }));
const uploadOut = toBinary(UploadFileResponseSchema, create(UploadFileResponseSchema, { file: { path: "/w/a", bytes: 5n } }));
const detailed = new ConnectError("refused", Code.FailedPrecondition, undefined, [{ desc: ExecuteResponseSchema, value: { exitCode: 9 } }]);
/** A google.rpc.Status with details and code 0 (OK): the same one without its first field (code = 9). */
const codeZero = Buffer.from(statusBin(detailed), "base64").subarray(2).toString("base64").replace(/=+$/, "");

/** Every shape of answer, for a method whose one output message is `out`. */
const answers = (out: Uint8Array): Record<string, Answer> => ({
  ok: { headers: { ...GRPC, "x-h": "1" }, messages: [out], trailers: { "grpc-status": "0", "x-t": "2" } },
  okWithMessage: { headers: GRPC, messages: [out], trailers: { "grpc-status": "0", "grpc-message": "fine" } },
  error: { headers: GRPC, trailers: { "grpc-status": "5", "grpc-message": encodeURIComponent(MESSAGE), "x-sandbar-detail": "kept" } },
  errorAfterMessage: { headers: GRPC, messages: [out], trailers: { "grpc-status": "13", "grpc-message": "late" } },
  details: { headers: GRPC, trailers: { "grpc-status": "9", "grpc-message": "refused", "grpc-status-details-bin": statusBin(detailed) } },
  detailsSayOk: { headers: GRPC, messages: [out], trailers: { "grpc-status": "0", "grpc-status-details-bin": codeZero } },
  badDetails: { headers: GRPC, trailers: { "grpc-status": "9", "grpc-status-details-bin": "not base64 !" } },
  unknownCode: { headers: GRPC, trailers: { "grpc-status": "99", "grpc-message": "what" } },
  trailersOnly: { headers: { ...GRPC, "grpc-status": "7", "grpc-message": "denied", "x-h": "3" } },
  http503: { status: 503, headers: { "content-type": "text/plain" } },
  http404: { status: 404, headers: GRPC },
  notGrpc: { headers: { "content-type": "text/html" }, messages: [out], trailers: { "grpc-status": "0" } },
  compressed: { headers: { ...GRPC, "grpc-encoding": "gzip" }, messages: [out], trailers: { "grpc-status": "0" } },
  noStatus: { headers: GRPC, messages: [out] },
  noMessage: { headers: GRPC, trailers: { "grpc-status": "0" } },
  twoMessages: { headers: GRPC, messages: [out, out], trailers: { "grpc-status": "0" } },
  halfMessage: { headers: GRPC, messages: [envelope(out).subarray(0, 7)], trailers: { "grpc-status": "0" } },
  garbage: { headers: GRPC, messages: [new Uint8Array([0xff, 0xff, 0xff])], trailers: { "grpc-status": "0" } },
});

describe("answers read as Connect's client reads them", () => {
  let server: http2.Http2Server;
  /** Request headers and bodies as received, by case. */
  const received = new Map<string, { headers: http2.IncomingHttpHeaders; body: Buffer }[]>();
  beforeAll(async () => {
    server = http2.createServer();
    // Answers a client resets (it refused them) end in stream errors here: expected.
    server.on("session", (s) => s.on("error", () => undefined));
    server.on("stream", (stream, headers) => {
      stream.on("error", () => undefined);
      const name = String(headers["x-case"]);
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => {
        const list = received.get(name) ?? [];
        list.push({ headers, body: Buffer.concat(chunks) });
        received.set(name, list);
        const out = headers[":path"]?.endsWith("/Execute") ? executeOut : uploadOut;
        const a = answers(out)[name];
        const body = (a.messages ?? []).map((m) => (name === "halfMessage" ? Buffer.from(m) : envelope(m)));
        if (!a.trailers && body.length === 0) return stream.respond({ ":status": a.status ?? 200, ...a.headers }, { endStream: true });
        stream.respond({ ":status": a.status ?? 200, ...a.headers }, { waitForTrailers: a.trailers !== undefined });
        if (a.trailers) stream.once("wantTrailers", () => stream.sendTrailers(a.trailers!));
        stream.end(Buffer.concat(body));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  });
  afterAll(() => new Promise((r) => server.close(r)));

  const sessions: Http2SessionManager[] = [];
  afterAll(() => sessions.forEach((s) => s.abort()));
  /** A session to the raw server as control keeps one to an agent (its authority "agent"). */
  const session = () => {
    const port = (server.address() as AddressInfo).port;
    const s = new Http2SessionManager("http://agent", undefined, { createConnection: () => netConnect(port, "127.0.0.1") });
    sessions.push(s);
    return s;
  };
  /** Connect's gRPC client as control's calls to the agent are made: no compression offered. */
  const connectTransport = () => createGrpcTransport({ baseUrl: "http://agent", sessionManager: session(), acceptCompression: [] });

  for (const name of Object.keys(answers(executeOut))) {
    it(`unary, ${name}: agentUnary's result or error is Connect's client's`, async () => {
      const headers = { authorization: "Bearer s", "x-case": name };
      const connect = createClient(ProcessService, connectTransport());
      const theirs = outcome(await failure(connect.execute({ command: "x" }, { headers })));
      const ours = outcome(await failure(agentUnary(session(), ProcessService.method.execute, { command: "x" }, { headers })));
      expect(ours).toEqual(theirs);
    });
  }

  // What an upload sends: a header, data in pieces, then more data (joined by uploadFrames).
  const pieces = [new Uint8Array([1, 2, 3]), new Uint8Array(70_000).fill(7), new Uint8Array(0), new Uint8Array(300_000).fill(9)];
  async function* upload() {
    yield { part: { case: "header" as const, value: { path: "/w/a" } } };
    for (const p of pieces) yield { part: { case: "data" as const, value: p } };
  }

  for (const name of Object.keys(answers(uploadOut))) {
    it(`client stream (upload), ${name}: the framed transport's result or error is Connect's transport's`, async () => {
      const headers = { authorization: "Bearer s", "x-case": name };
      const connect = createClient(FileService, connectTransport());
      const theirs = outcome(await failure(connect.uploadFile(upload(), { headers })));
      const framed = createClient(FileService, createAgentTransport(session(), new SendBudget(8 << 20)));
      const ours = outcome(await failure(framed.uploadFile(upload(), { headers })));
      if (["noStatus", "halfMessage", "garbage"].includes(name)) {
        // An answer broken off without a status, or that cannot be read: the framed transport says
        // what is known of the file (toolbox/send-budget.ts lostAnswer) where Connect's gives the bare error.
        expect(ours).toMatchObject({ code: Code.Unavailable, message: expect.stringContaining("was sent whole, but the sandbox's answer was lost") });
        // The reason given inside is Connect's (a missing status is named in lostAnswer's own words).
        if (name !== "noStatus" && "message" in theirs) expect(ours.message).toContain(`(${theirs.message})`);
        return;
      }
      expect(ours).toEqual(theirs);
    });
  }

  it("sends the request Connect's transport sends: headers, and messages that decode to the same upload", async () => {
    const [theirs, ours] = received.get("ok")!.filter((r) => r.headers[":path"]?.endsWith("/UploadFile"));
    const strip = (h: http2.IncomingHttpHeaders) => {
      const { "user-agent": ua, "x-sandbar-upload-sealed": sealed, ...rest } = h;
      expect(String(ua)).toMatch(/^connect-es\//); // Connect names its own version
      return { rest, sealed };
    };
    expect(strip(ours.headers).rest).toEqual(strip(theirs.headers).rest);
    expect(strip(ours.headers).sealed).toBe("1");
    const decode = async (body: Buffer) => {
      const msgs = [];
      for await (const e of splitEnvelopes((async function* () { yield body; })())) msgs.push({ flags: e.flags, message: fromBinary(UploadFileRequestSchema, e.data) });
      return msgs;
    };
    const a = await decode(theirs.body);
    const b = await decode(ours.body);
    const content = (msgs: typeof a) => Buffer.concat(msgs.flatMap((m) => (m.message.part.case === "data" ? [m.message.part.value] : [])));
    expect(b.every((m) => m.flags === 0)).toBe(true);
    expect(b[0].message).toEqual(a[0].message); // the header
    expect(content(b).equals(content(a))).toBe(true); // the data, joined into fewer messages
    expect(b.at(-1)?.message.part.case).toBe(undefined); // the seal: an empty message
  });

  it("reads trailers and headers as Connect's protocol functions do", () => {
    for (const [name, a] of Object.entries(answers(executeOut))) {
      const h = new Headers(a.headers);
      const t = new Headers(a.trailers ?? {});
      const run = (f: () => unknown) => {
        try {
          return { value: f() };
        } catch (e) {
          return outcome({ err: e });
        }
      };
      expect(run(() => validateResponse(a.status ?? 200, h)), name).toEqual(run(() => {
        const r = ref.validateResponseWithCompression([], a.status ?? 200, h);
        return { foundStatus: r.foundStatus, headerError: r.headerError };
      }));
      expect(run(() => validateTrailer(t, h)), name).toEqual(run(() => ref.validateTrailer(t, h)));
      expect(run(() => findStatusError(t)), name).toEqual(run(() => ref.findTrailerError(t)));
    }
  });
});
