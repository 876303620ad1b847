import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import * as http2 from "node:http2";
import { connect as netConnect } from "node:net";
import { readFile, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  FileService,
  UploadFileRequestSchema,
  UploadFileResponseSchema,
  UploadFilesResponseSchema,
} from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import { CHUNK_SIZE } from "../files/transfer.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

// gRPC uploads are decoded by the agent straight from the HTTP/2 stream (grpc-wire/upload.ts), not by
// Connect: these calls send hand-made gRPC bodies cut at awkward places to a real agent process and
// check the files against what the protobuf schema says the messages hold.

let agent: AgentProcess;
beforeAll(async () => {
  agent = await startAgentProcess();
});
afterAll(async () => {
  await agent?.stop();
});

const envelope = (msg: Uint8Array, flags = 0) => {
  const b = Buffer.alloc(5 + msg.length);
  b[0] = flags;
  b.writeUInt32BE(msg.length, 1);
  Buffer.from(msg).copy(b, 5);
  return b;
};
const header = (p: string) => toBinary(UploadFileRequestSchema, create(UploadFileRequestSchema, { part: { case: "header", value: { path: p } } }));
const data = (bytes: Uint8Array) => toBinary(UploadFileRequestSchema, create(UploadFileRequestSchema, { part: { case: "data", value: bytes } }));
const varint = (n: number) => {
  const out: number[] = [];
  while (n > 127) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
};

/** One file's messages: data of many sizes (varint lengths of 1 to 3 bytes), and data encoded in ways the streaming path must not take. */
function messages(dest: string): Uint8Array[] {
  const sizes = [0, 1, 9, 127, 128, 16383, 16384, 70_000, 300_000, 5];
  return [
    header(dest),
    ...sizes.map((n) => data(randomBytes(n))),
    new Uint8Array(0), // an empty message: no part
    Buffer.concat([Buffer.from([0x78, 0x01]), data(Buffer.from("after an unknown field"))]),
    Buffer.concat([data(Buffer.from("the first data field")), data(Buffer.from("and the last one wins"))]),
    Buffer.concat([Buffer.from([0x12, 0x83, 0x00]), Buffer.from("abc")]), // a length in a non-minimal varint
    Buffer.concat([Buffer.from([0x12]), varint(200_000), randomBytes(200_000)]),
  ];
}

/** What the schema says a file's messages write: their data, in order. */
function expected(msgs: Uint8Array[]): Buffer {
  const parts: Uint8Array[] = [];
  for (const m of msgs) {
    const req = fromBinary(UploadFileRequestSchema, m);
    if (req.part.case === "data") parts.push(req.part.value);
  }
  return Buffer.concat(parts);
}

/** Cuts a body into pieces of these sizes, in turn. */
function cut(body: Buffer, sizes: number[]): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0, i = 0; at < body.length; i++) {
    const n = sizes[i % sizes.length];
    out.push(body.subarray(at, at + n));
    at += n;
  }
  return out;
}

interface Answer {
  status: number;
  grpcStatus?: string;
  grpcMessage?: string;
  body: Buffer;
}

/** A raw gRPC call on the agent's socket, its body written piece by piece (each handed to the socket before the next). */
function call(method: string, pieces: Buffer[], headers: http2.OutgoingHttpHeaders = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect("http://localhost", { createConnection: () => netConnect(agent.socketPath) });
    session.on("error", reject);
    const req = session.request({
      ":method": "POST",
      ":path": `/sandbar.agent.v1.FileService/${method}`,
      "content-type": "application/grpc",
      te: "trailers",
      authorization: `Bearer ${agent.secret}`,
      ...headers,
    });
    const answer: Answer = { status: 0, body: Buffer.alloc(0) };
    const chunks: Buffer[] = [];
    req.on("response", (h) => {
      answer.status = Number(h[":status"]);
      if (h["grpc-status"] !== undefined) answer.grpcStatus = String(h["grpc-status"]);
    });
    req.on("trailers", (t) => {
      if (t["grpc-status"] !== undefined) answer.grpcStatus = String(t["grpc-status"]);
      if (t["grpc-message"] !== undefined) answer.grpcMessage = decodeURIComponent(String(t["grpc-message"]));
    });
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      session.close();
      answer.body = Buffer.concat(chunks);
      resolve(answer);
    });
    req.on("error", reject);
    void (async () => {
      for (const p of pieces) {
        if (req.destroyed || req.writableEnded) return;
        await new Promise<void>((r) => req.write(p, () => r()));
      }
      req.end();
    })();
  });
}

/** The answer's one message. */
function message(a: Answer): Buffer {
  expect(a.body.length).toBeGreaterThanOrEqual(5);
  expect(a.body[0]).toBe(0);
  expect(a.body.readUInt32BE(1)).toBe(a.body.length - 5);
  return a.body.subarray(5);
}

/** A client of the agent over the Connect protocol (which the agent leaves to Connect). */
function connectProtocolFiles() {
  const transport = createConnectTransport({
    baseUrl: "http://localhost",
    httpVersion: "2",
    nodeOptions: { createConnection: () => netConnect(agent.socketPath) },
    interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${agent.secret}`), next(req))],
  });
  return createClient(FileService, transport);
}

describe("gRPC uploads read from the stream", () => {
  for (const [name, sizes] of [
    ["one write", [1 << 30]],
    ["a byte at a time near the start, then odd sizes", [1, 1, 1, 1, 1, 1, 1, 2, 3, 5, 7, 11, 13, 17, 4099, 65_537, 7]],
    ["cuts inside envelope headers and varints", [3, 4, 2, 9, 6, 1, 70_001]],
  ] as const) {
    it(`writes what the messages hold (${name})`, async () => {
      const msgs = messages("cut/one.bin");
      const body = Buffer.concat(msgs.map((m) => envelope(m)));
      const a = await call("UploadFile", cut(body, [...sizes]));
      expect(a.grpcStatus, a.grpcMessage).toBe("0");
      expect(a.status).toBe(200);
      const res = fromBinary(UploadFileResponseSchema, message(a));
      const want = expected(msgs);
      expect(res.file).toMatchObject({ path: "cut/one.bin", bytes: BigInt(want.length) });
      expect((await readFile(path.join(agent.root, "cut/one.bin"))).equals(want)).toBe(true);
    });
  }

  it("writes several files in one UploadFiles, each from its header on", async () => {
    const a1 = messages(" many/a.bin ");
    const a2 = messages("many/b.bin");
    const body = Buffer.concat([...a1, ...a2].map((m) => envelope(m)));
    const a = await call("UploadFiles", cut(body, [7, 65_536, 13]));
    expect(a.grpcStatus, a.grpcMessage).toBe("0");
    const res = fromBinary(UploadFilesResponseSchema, message(a));
    expect(res.files.map((f) => [f.path, f.bytes])).toEqual([
      ["many/a.bin", BigInt(expected(a1).length)],
      ["many/b.bin", BigInt(expected(a2).length)],
    ]);
    expect((await readFile(path.join(agent.root, "many/a.bin"))).equals(expected(a1))).toBe(true);
    expect((await readFile(path.join(agent.root, "many/b.bin"))).equals(expected(a2))).toBe(true);
  });

  it("answers errors as gRPC statuses, as Connect does, and claims no file", async () => {
    const ok = [envelope(header("err/x.bin")), envelope(data(Buffer.from("x")))];
    // Another secret.
    expect((await call("UploadFile", ok, { authorization: "Bearer nope" })).grpcStatus).toBe(String(Code.Unauthenticated));
    // Data before any header, in each method.
    const early = await call("UploadFile", [envelope(data(Buffer.from("x")))]);
    expect([early.grpcStatus, early.grpcMessage]).toEqual([String(Code.InvalidArgument), "the first message of an upload must be its header"]);
    expect((await call("UploadFiles", [envelope(data(Buffer.from("x")))])).grpcStatus).toBe(String(Code.InvalidArgument));
    // Two headers in UploadFile.
    expect((await call("UploadFile", [...ok, envelope(header("err/y.bin"))])).grpcStatus).toBe(String(Code.InvalidArgument));
    // A body that ends inside a message, and one inside an envelope header.
    const whole = Buffer.concat(ok);
    const cutShort = await call("UploadFile", [whole.subarray(0, whole.length - 1)]);
    expect([cutShort.grpcStatus, cutShort.body.length]).toEqual([String(Code.InvalidArgument), 0]);
    expect((await call("UploadFile", [Buffer.concat([whole, Buffer.from([0, 0])])])).grpcStatus).toBe(String(Code.InvalidArgument));
    // A compressed message (none was negotiated), and one beyond the size limit.
    expect((await call("UploadFile", [ok[0], envelope(data(Buffer.from("x")), 1)])).grpcStatus).toBe(String(Code.Internal));
    const huge = Buffer.alloc(5);
    huge.writeUInt32BE(64 * 1024 * 1024, 1);
    expect((await call("UploadFile", [ok[0], huge])).grpcStatus).toBe(String(Code.ResourceExhausted));
    // A header that is not a valid message.
    expect((await call("UploadFile", [envelope(Buffer.from([0x0a, 0x05, 0x61]))])).grpcStatus).not.toBe("0");
    expect((await agent.client(InfoService).getVersion({})).version).not.toBe("");
  });

  it("fails an upload whose writes fail mid-stream (a full disk) and goes on serving", async () => {
    const fs = agent.client(FileService);
    const chunk = randomBytes(256 * 1024);
    const err = await fs
      .uploadFile(
        (async function* () {
          yield { part: { case: "header" as const, value: { path: "/dev/full" } } };
          for (let i = 0; i < 64; i++) yield { part: { case: "data" as const, value: chunk } };
        })(),
      )
      .catch((e: unknown) => e);
    expect(ConnectError.from(err).code).toBe(Code.ResourceExhausted);
    expect(ConnectError.from(err).rawMessage).toContain("no space left on device");
    // Smaller than a write batch: written only as the upload ends, and failed there.
    const small = await fs
      .uploadFile(
        (async function* () {
          yield { part: { case: "header" as const, value: { path: "/dev/full" } } };
          yield { part: { case: "data" as const, value: Buffer.from("ten bytes!") } };
        })(),
      )
      .catch((e: unknown) => e);
    expect(ConnectError.from(small).code).toBe(Code.ResourceExhausted);
    const after = await fs.uploadFile(
      (async function* () {
        yield { part: { case: "header" as const, value: { path: "after-full.bin" } } };
        yield { part: { case: "data" as const, value: chunk } };
      })(),
    );
    expect(after.file?.bytes).toBe(BigInt(chunk.length));
    expect((await readFile(path.join(agent.root, "after-full.bin"))).equals(chunk)).toBe(true);
  });

  it("leaves other protocols to Connect: the same upload over the Connect protocol", async () => {
    const fs = connectProtocolFiles();
    const msgs = messages("connect/one.bin");
    const res = await fs.uploadFile(
      (async function* () {
        for (const m of msgs) yield fromBinary(UploadFileRequestSchema, m);
      })(),
    );
    const want = expected(msgs);
    expect(res.file?.bytes).toBe(BigInt(want.length));
    expect((await readFile(path.join(agent.root, "connect/one.bin"))).equals(want)).toBe(true);
  });
});

describe("gRPC downloads framed from the file", () => {
  /** Every message of a download, as a client decodes them. */
  async function download(fs: ReturnType<typeof connectProtocolFiles>, p: string) {
    const msgs = [];
    for await (const m of fs.downloadFile({ path: p })) msgs.push(m);
    return msgs;
  }

  it("sends the file's info, then its bytes in messages whose lengths take 1 to 3 varint bytes, as Connect would", async () => {
    const grpcFiles = agent.client(FileService);
    const connectFiles = connectProtocolFiles();
    for (const size of [0, 1, 127, 128, 16_383, 16_384, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE + 12_345]) {
      const bytes = randomBytes(size);
      await writeFile(path.join(agent.root, `down-${size}.bin`), bytes);
      const direct = await download(grpcFiles, `down-${size}.bin`);
      const viaConnect = await download(connectFiles, `down-${size}.bin`);
      expect(direct[0].part.case).toBe("info");
      expect(direct[0].part.value).toEqual(viaConnect[0].part.value);
      expect(direct[0].part.value).toMatchObject({ name: `down-${size}.bin`, size: BigInt(size) });
      const data = direct.slice(1).map((m) => {
        expect(m.part.case).toBe("data");
        return m.part.value as Uint8Array;
      });
      expect(data.length).toBe(Math.ceil(size / CHUNK_SIZE));
      expect(Buffer.concat(data).equals(bytes), `${size} bytes`).toBe(true);
      expect(Buffer.concat(viaConnect.slice(1).map((m) => m.part.value as Uint8Array)).equals(bytes)).toBe(true);
    }
  });

  it("answers errors as gRPC statuses: another secret, a missing file, a directory, a bad request", async () => {
    const grpcFiles = agent.client(FileService);
    const codeOf = (p: Promise<unknown>) => p.then(() => 0, (e: unknown) => ConnectError.from(e).code);
    expect(await codeOf(download(grpcFiles, "no-such-file"))).toBe(Code.NotFound);
    expect(await codeOf(download(grpcFiles, "."))).toBe(Code.InvalidArgument);
    expect(await codeOf(download(grpcFiles, ""))).toBe(Code.InvalidArgument);
    const req = (body: Buffer, headers: http2.OutgoingHttpHeaders = {}) =>
      new Promise<string | undefined>((resolve, reject) => {
        const session = http2.connect("http://localhost", { createConnection: () => netConnect(agent.socketPath) });
        const r = session.request({ ":method": "POST", ":path": "/sandbar.agent.v1.FileService/DownloadFile", "content-type": "application/grpc", authorization: `Bearer ${agent.secret}`, ...headers });
        let status: string | undefined;
        r.on("response", (h) => (status = h["grpc-status"] as string | undefined));
        r.on("trailers", (t) => (status = t["grpc-status"] as string | undefined));
        r.on("data", () => undefined);
        r.on("end", () => (session.close(), resolve(status)));
        r.on("error", reject);
        r.end(body);
      });
    await writeFile(path.join(agent.root, "small.bin"), "x");
    const ok = envelope(Buffer.from([0x0a, 0x09, ...Buffer.from("small.bin")]));
    expect(await req(ok)).toBe("0");
    expect(await req(ok, { authorization: "Bearer nope" })).toBe(String(Code.Unauthenticated));
    expect(await req(ok.subarray(0, ok.length - 1))).toBe(String(Code.InvalidArgument));
    expect(await req(Buffer.concat([ok, ok]))).toBe(String(Code.InvalidArgument));
    expect(await req(Buffer.from([1, ...ok.subarray(1)]))).toBe(String(Code.Internal));
  });
});
