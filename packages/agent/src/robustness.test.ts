import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import * as http2 from "node:http2";
import { connect as netConnect } from "node:net";
import { readFile, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DownloadFileRequestSchema, DownloadFileResponseSchema, FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { startAgentProcess } from "./testing/agent-process.ts";
import type { AgentProcess } from "./testing/agent-process.ts";

let agent: AgentProcess;
beforeAll(async () => {
  agent = await startAgentProcess({ extraArgs: ["--port", "0", "--host", "127.0.0.1"] });
});
afterAll(async () => {
  await agent?.stop();
});

const alive = async () => expect((await agent.client(InfoService).getVersion({})).version).not.toBe("");

/** A raw HTTP/2 request on the agent's socket; resolves with the status and gRPC status. */
function rawRequest(headers: http2.OutgoingHttpHeaders, body: Buffer): Promise<{ status: number; grpcStatus?: string }> {
  return new Promise((resolve, reject) => {
    const session = http2.connect("http://localhost", { createConnection: () => netConnect(agent.socketPath) });
    session.on("error", reject);
    const req = session.request({ ":method": "POST", authorization: `Bearer ${agent.secret}`, ...headers });
    let status = 0;
    let grpcStatus: string | undefined;
    req.on("response", (h) => {
      status = Number(h[":status"]);
      if (h["grpc-status"] !== undefined) grpcStatus = String(h["grpc-status"]);
    });
    req.on("trailers", (t) => {
      if (t["grpc-status"] !== undefined) grpcStatus = String(t["grpc-status"]);
    });
    req.on("data", () => undefined);
    req.on("end", () => {
      session.close();
      resolve({ status, grpcStatus });
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("no request can crash the agent", () => {
  it("survives garbage and HTTP/1.1 on its socket", async () => {
    for (const junk of ["\x00\x01\x02garbage\r\n\r\n", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff"]) {
      await new Promise<void>((resolve) => {
        const s = netConnect(agent.socketPath, () => s.end(junk, "latin1"));
        s.on("data", () => undefined);
        s.on("error", () => resolve());
        s.on("close", () => resolve());
      });
    }
    await alive();
  });

  it("answers unknown paths and malformed messages with errors", async () => {
    expect((await rawRequest({ ":path": "/no.such.Service/Method", "content-type": "application/grpc" }, Buffer.alloc(0))).status).toBe(404);
    expect((await rawRequest({ ":path": "/sandbar.agent.v1.InfoService/NoSuchMethod", "content-type": "application/grpc" }, Buffer.alloc(0))).status).toBe(404);
    // A gRPC frame whose length lies, and one holding bytes that are no protobuf message.
    const lying = Buffer.from([0, 0, 0, 0, 100, 1, 2, 3]);
    const junk = Buffer.concat([Buffer.from([0, 0, 0, 0, 5]), Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff])]);
    for (const body of [lying, junk]) {
      const res = await rawRequest({ ":path": "/sandbar.agent.v1.ProcessService/Execute", "content-type": "application/grpc", te: "trailers" }, body);
      expect(res.status).toBe(200);
      expect(res.grpcStatus).not.toBe("0");
    }
    await alive();
  });

  it("survives callers that go away mid-stream", async () => {
    const files = agent.client(FileService);
    await writeFile(path.join(agent.root, "big"), Buffer.alloc(8 * 1024 * 1024, 1));
    const ac = new AbortController();
    let got = 0;
    const download = (async () => {
      for await (const m of files.downloadFile({ path: "big" }, { signal: ac.signal })) {
        got += m.part.case === "data" ? m.part.value.length : 0;
        if (got > 1024 * 1024) ac.abort();
      }
    })();
    expect(ConnectError.from(await download.catch((e: unknown) => e)).code).toBe(Code.Canceled);
    const up = new AbortController();
    const upload = files.uploadFile(
      (async function* () {
        yield { part: { case: "header" as const, value: { path: "partial" } } };
        for (let i = 0; i < 100; i++) {
          if (i === 10) up.abort();
          yield { part: { case: "data" as const, value: Buffer.alloc(64 * 1024) } };
        }
      })(),
      { signal: up.signal },
    );
    expect(ConnectError.from(await upload.catch((e: unknown) => e)).code).toBe(Code.Canceled);
    const proc = agent.client(ProcessService);
    await proc.createSession({ sessionId: "gone" });
    const { cmdId } = await proc.sessionExecute({ sessionId: "gone", command: "sleep 1; echo x", runAsync: true });
    const fol = new AbortController();
    const following = (async () => {
      for await (const _ of proc.streamSessionCommandLogs({ sessionId: "gone", commandId: cmdId, follow: true }, { signal: fol.signal })) void _;
    })();
    setTimeout(() => fol.abort(), 100);
    await following.catch(() => undefined);
    const exec = new AbortController();
    setTimeout(() => exec.abort(), 200);
    await proc.execute({ command: "sleep 30" }, { signal: exec.signal }).catch(() => undefined);
    await alive();
    expect(agent.child.exitCode).toBeNull();
    // Nothing escaped to the last-resort handlers.
    expect(agent.output()).not.toMatch(/uncaught|unhandled/);
  });
});

/** CPU seconds a process has used (user + system). */
async function cpuSeconds(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, "latin1");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

describe("a connection outlives cancelled calls", () => {
  it("serves downloads and uploads after many downloads were cancelled mid-stream", async () => {
    const files = agent.client(FileService);
    await writeFile(path.join(agent.root, "cancel-me"), Buffer.alloc(8 * 1024 * 1024, 2));
    for (let round = 0; round < 60; round++) {
      const ac = new AbortController();
      let got = 0;
      await (async () => {
        for await (const m of files.downloadFile({ path: "cancel-me" }, { signal: ac.signal })) {
          got += m.part.case === "data" ? m.part.value.length : 0;
          if (got > 1024 * 1024) ac.abort();
        }
      })().catch(() => undefined);
    }
    let n = 0;
    for await (const m of files.downloadFile({ path: "cancel-me" })) n += m.part.case === "data" ? m.part.value.length : 0;
    expect(n).toBe(8 * 1024 * 1024);
    const up = await files.uploadFile(
      (async function* () {
        yield { part: { case: "header" as const, value: { path: "after-cancels" } } };
        yield { part: { case: "data" as const, value: Buffer.from("fine") } };
      })(),
    );
    expect(up.file?.bytes).toBe(4n);
  });
});

describe("when whoever reads its output goes away", () => {
  it("goes on serving quietly (no error loop on a broken stderr)", async () => {
    const lonely = await startAgentProcess();
    try {
      lonely.child.stdout!.destroy();
      lonely.child.stderr!.destroy();
      // Junk on the socket makes the agent log an HTTP/2 session error.
      for (let i = 0; i < 3; i++) {
        await new Promise<void>((resolve) => {
          const s = netConnect(lonely.socketPath, () => s.end("\x00junk\r\n\r\n", "latin1"));
          s.on("data", () => undefined);
          s.on("error", () => resolve());
          s.on("close", () => resolve());
        });
      }
      // It answers: the junk has been handled. Then its CPU time over a second of idling (the window
      // is the measurement; CPU time does not grow with other processes' load).
      expect((await lonely.client(InfoService).getVersion({})).version).not.toBe("");
      const before = await cpuSeconds(lonely.child.pid!);
      await new Promise((r) => setTimeout(r, 1000));
      const used = (await cpuSeconds(lonely.child.pid!)) - before;
      expect(used).toBeLessThan(0.2);
      expect((await lonely.client(InfoService).getVersion({})).version).not.toBe("");
    } finally {
      await lonely.stop();
    }
  });
});

describe("transports", () => {
  it("also serves on a TCP port when asked", async () => {
    const port = JSON.parse(agent.output().split("\n").find((l) => l.includes('"ready"')) ?? "{}").port as number;
    expect(port).toBeGreaterThan(0);
    const transport = createGrpcTransport({
      baseUrl: `http://127.0.0.1:${port}`,
      interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${agent.secret}`), next(req))],
    });
    expect((await createClient(ProcessService, transport).execute({ command: "echo tcp" })).result).toBe("tcp\n");
    const refused = createGrpcTransport({ baseUrl: `http://127.0.0.1:${port}` });
    const err = await createClient(InfoService, refused).getVersion({}).catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.Unauthenticated);
  });

  it("streams to @grpc/grpc-js", async () => {
    await writeFile(path.join(agent.root, "grpc.txt"), "streamed to grpc-js");
    const client = new grpc.Client(`unix://${agent.socketPath}`, grpc.credentials.createInsecure());
    const md = new grpc.Metadata();
    md.set("authorization", `Bearer ${agent.secret}`);
    const call = client.makeServerStreamRequest(
      "/sandbar.agent.v1.FileService/DownloadFile",
      (m: ReturnType<typeof create<typeof DownloadFileRequestSchema>>) => Buffer.from(toBinary(DownloadFileRequestSchema, m)),
      (b: Buffer) => fromBinary(DownloadFileResponseSchema, b),
      create(DownloadFileRequestSchema, { path: "grpc.txt" }),
      md,
    );
    let text = "";
    let name = "";
    for await (const m of call as AsyncIterable<ReturnType<typeof fromBinary<typeof DownloadFileResponseSchema>>>) {
      if (m.part.case === "info") name = m.part.value.name;
      if (m.part.case === "data") text += Buffer.from(m.part.value).toString();
    }
    client.close();
    expect({ name, text }).toEqual({ name: "grpc.txt", text: "streamed to grpc-js" });
  });
});
