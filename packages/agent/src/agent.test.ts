import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { connect as netConnect } from "node:net";
import { existsSync } from "node:fs";
import {
  GetVersionRequestSchema,
  GetVersionResponseSchema,
  DirResponseSchema,
  GetWorkDirRequestSchema,
  InfoService,
} from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { ExecuteRequestSchema, ExecuteResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { socketTransport, startAgentProcess } from "./testing/agent-process.ts";
import type { AgentProcess } from "./testing/agent-process.ts";
import { AGENT_VERSION } from "./version.ts";

let agent: AgentProcess;
beforeAll(async () => {
  agent = await startAgentProcess({ env: { SANDBAR_AGENT_SECRET: "must-not-leak" } });
});
afterAll(async () => {
  await agent?.stop();
});

function grpcUnary<I, O>(client: grpc.Client, path: string, ser: (m: I) => Uint8Array, de: (b: Uint8Array) => O, req: I, secret?: string): Promise<O> {
  const md = new grpc.Metadata();
  if (secret !== undefined) md.set("authorization", `Bearer ${secret}`);
  return new Promise((resolve, reject) =>
    client.makeUnaryRequest(path, (m: I) => Buffer.from(ser(m)), (b: Buffer) => de(b), req, md, (err, res) => (err ? reject(err) : resolve(res!))),
  );
}

describe("agent process", () => {
  it("answers a Connect client over its unix socket (gRPC protocol)", async () => {
    const info = agent.client(InfoService);
    expect((await info.getVersion({})).version).toBe(AGENT_VERSION);
    expect((await info.getWorkDir({})).dir).toBe(agent.root);
    expect((await info.getUserHomeDir({})).dir).toBe(agent.root);
    expect((await info.getProjectDir({})).dir).toBe(agent.root);
  });

  it("answers a Connect client speaking the Connect protocol over HTTP/2", async () => {
    const transport = createConnectTransport({
      baseUrl: "http://localhost",
      httpVersion: "2",
      nodeOptions: { createConnection: () => netConnect(agent.socketPath) },
      interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${agent.secret}`), next(req))],
    });
    const info = createClient(InfoService, transport);
    expect((await info.getVersion({})).version).toBe(AGENT_VERSION);
  });

  it("answers @grpc/grpc-js", async () => {
    const client = new grpc.Client(`unix://${agent.socketPath}`, grpc.credentials.createInsecure());
    try {
      const res = await grpcUnary(
        client,
        "/sandbar.agent.v1.InfoService/GetVersion",
        (m) => toBinary(GetVersionRequestSchema, m),
        (b) => fromBinary(GetVersionResponseSchema, b),
        create(GetVersionRequestSchema),
        agent.secret,
      );
      expect(res.version).toBe(AGENT_VERSION);
      const dir = await grpcUnary(
        client,
        "/sandbar.agent.v1.InfoService/GetWorkDir",
        (m) => toBinary(GetWorkDirRequestSchema, m),
        (b) => fromBinary(DirResponseSchema, b),
        create(GetWorkDirRequestSchema),
        agent.secret,
      );
      expect(dir.dir).toBe(agent.root);
      const exec = await grpcUnary(
        client,
        "/sandbar.agent.v1.ProcessService/Execute",
        (m) => toBinary(ExecuteRequestSchema, m),
        (b) => fromBinary(ExecuteResponseSchema, b),
        create(ExecuteRequestSchema, { command: "echo grpc-js" }),
        agent.secret,
      );
      expect(exec).toMatchObject({ exitCode: 0, result: "grpc-js\n" });
      // Without the secret, grpc-js sees UNAUTHENTICATED too.
      const refused = await grpcUnary(
        client,
        "/sandbar.agent.v1.InfoService/GetVersion",
        (m) => toBinary(GetVersionRequestSchema, m),
        (b) => fromBinary(GetVersionResponseSchema, b),
        create(GetVersionRequestSchema),
      ).catch((e: grpc.ServiceError) => e);
      expect((refused as grpc.ServiceError).code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      client.close();
    }
  });

  it("refuses calls without the secret or with a wrong one", async () => {
    for (const secret of ["", "wrong", agent.secret + "x", agent.secret.slice(0, -1)]) {
      const info = createClient(InfoService, socketTransport(agent.socketPath, secret));
      const err = await info.getVersion({}).catch((e: unknown) => ConnectError.from(e));
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.Unauthenticated);
    }
    // Every service is guarded, not just info.
    const proc = createClient(ProcessService, socketTransport(agent.socketPath, "wrong"));
    const err = await proc.execute({ command: "true" }).catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.Unauthenticated);
  });

  it("keeps the secret from the commands it runs", async () => {
    const proc = agent.client(ProcessService);
    const res = await proc.execute({ command: "env" });
    expect(res.exitCode).toBe(0);
    expect(res.result).not.toContain("must-not-leak");
    expect(res.result).not.toContain(agent.secret);
    expect(res.result).not.toContain("SANDBAR_AGENT");
  });

  it("shuts down cleanly on SIGTERM, removing its socket", async () => {
    const other = await startAgentProcess();
    const proc = other.client(ProcessService);
    await proc.createSession({ sessionId: "s" });
    const { cmdId } = await proc.sessionExecute({ sessionId: "s", command: "sleep 600", runAsync: true });
    expect(cmdId).not.toBe("");
    const socket = other.socketPath;
    // Exit code 0: it ended by itself; the harness's SIGKILL (for an agent that hangs) would leave none.
    const code = await other.stop();
    expect(code).toBe(0);
    expect(existsSync(socket)).toBe(false);
  });
});
