import { mkdtemp, rm } from "node:fs/promises";
import http2 from "node:http2";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ExecuteResponseSchema, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { create } from "@bufbuild/protobuf";
import { AgentClients } from "../toolbox/agent-clients.ts";
import { agentUnary } from "./client-unary.ts";

// agentUnary against a real Connect server on a real unix socket (the agent's own stack, serving
// the agent's ProcessService with answers chosen per command), beside Connect's client on the same
// session: what Connect's client returns or raises is what agentUnary must. The real agent in a
// sandbox is covered by toolbox/rest/process.test.ts and test/sdk (exec, 408 timeouts).

let dir: string;
let server: http2.Http2Server;
const clients = new AgentClients();
let dial: { key: string; api: () => ReturnType<typeof connect> };
/** Signals of the handler calls that ended by abort, by command. */
const aborted = new Map<string, unknown>();
/** Commands whose handler call has begun. */
const begun = new Set<string>();
const BIG = "x".repeat(3 * 1024 * 1024 + 17);

function execute(req: { command: string }, ctx: HandlerContext) {
  ctx.signal.addEventListener("abort", () => aborted.set(req.command, ctx.signal.reason));
  begun.add(req.command);
  switch (req.command) {
    case "ok":
      ctx.responseHeader.set("x-sandbar-probe", "seen");
      return create(ExecuteResponseSchema, { exitCode: 3, result: "héllo\n" });
    case "big":
      return create(ExecuteResponseSchema, { exitCode: 0, result: BIG });
    case "error":
      throw new ConnectError("no such thing: ünïcode 100% / %20", Code.NotFound, { "x-sandbar-detail": "kept" });
    case "error-with-details":
      throw new ConnectError("refused", Code.FailedPrecondition, undefined, [{ desc: ExecuteResponseSchema, value: { exitCode: 9 } }]);
    case "slow":
      // Never answers: a reply to the caller can only come from its own deadline or signal.
      return new Promise<never>(() => undefined);
    default:
      throw new Error("unexpected");
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "agent-unary-"));
  const socket = join(dir, "agent.sock");
  server = http2.createServer(connectNodeAdapter({ routes: (r) => r.service(ProcessService, { execute }) }));
  await new Promise<void>((resolve) => server.listen(socket, resolve));
  dial = { key: socket, api: () => connect(socket) };
});

afterAll(async () => {
  clients.close();
  await new Promise((r) => server.close(r));
  await rm(dir, { recursive: true, force: true });
});

const opts = { headers: { authorization: "Bearer s" } };
const viaConnect = (command: string) => clients.client(ProcessService, dial).execute({ command }, opts);
const viaLean = (command: string, more: Partial<Parameters<typeof agentUnary>[3]> = {}) =>
  agentUnary(clients.session(dial), ProcessService.method.execute, { command }, { ...opts, ...more });
const failure = (p: Promise<unknown>) => p.then(() => { throw new Error("expected a failure"); }, (e: unknown) => e as ConnectError);

describe("agentUnary", () => {
  it("returns the agent's message and hands over its response headers", async () => {
    const seen: string[] = [];
    const out = await viaLean("ok", { onHeader: (h) => seen.push(String(h["x-sandbar-probe"])) });
    expect(out).toEqual(await viaConnect("ok"));
    expect(out.exitCode).toBe(3);
    expect(out.result).toBe("héllo\n");
    expect(seen).toEqual(["seen"]);
  });

  it("reads a message that spans many frames", async () => {
    const out = await viaLean("big");
    expect(out.result.length).toBe(BIG.length);
    expect(out.result === BIG).toBe(true);
  });

  it("raises the agent's error as Connect's client does: code, message, metadata", async () => {
    const lean = await failure(viaLean("error"));
    const ref = await failure(viaConnect("error"));
    expect(lean).toBeInstanceOf(ConnectError);
    expect(lean.code).toBe(Code.NotFound);
    expect(lean.rawMessage).toBe("no such thing: ünïcode 100% / %20");
    expect(lean.rawMessage).toBe(ref.rawMessage);
    expect(lean.metadata.get("x-sandbar-detail")).toBe("kept");
    expect(lean.isWireError).toBe(true);
  });

  it("keeps an error's details", async () => {
    const lean = await failure(viaLean("error-with-details"));
    const ref = await failure(viaConnect("error-with-details"));
    expect(lean.code).toBe(Code.FailedPrecondition);
    expect(lean.details).toEqual(ref.details);
    expect(lean.details.length).toBe(1);
  });

  it("gives up at the timeout with DEADLINE_EXCEEDED, and the agent's call is cancelled", async () => {
    const err = await failure(agentUnary(clients.session(dial), ProcessService.method.execute, { command: "slow" }, { ...opts, timeoutMs: 150 }));
    expect(err.code).toBe(Code.DeadlineExceeded);
    await expect.poll(() => aborted.has("slow")).toBe(true);
  });

  it("is cancelled by its signal, and so is the agent's call", async () => {
    aborted.clear();
    begun.clear();
    const abort = new AbortController();
    const call = failure(viaLean("slow", { signal: abort.signal }));
    // Cancelled mid-call: once the agent is at work on it.
    await expect.poll(() => begun.has("slow")).toBe(true);
    abort.abort();
    const err = await call;
    expect(err.code).toBe(Code.Canceled);
    await expect.poll(() => aborted.has("slow")).toBe(true);
    // The session is still good for the next call.
    expect((await viaLean("ok")).exitCode).toBe(3);
  });

  it("fails at once for a signal already aborted or a deadline already passed", async () => {
    const abort = new AbortController();
    abort.abort();
    expect((await failure(viaLean("ok", { signal: abort.signal }))).code).toBe(Code.Canceled);
    expect((await failure(viaLean("ok", { timeoutMs: 0 }))).code).toBe(Code.DeadlineExceeded);
  });

  it("reports an unreachable agent with the code Connect's client gives", async () => {
    const gone = { key: join(dir, "nobody.sock"), api: () => connect(join(dir, "nobody.sock")) };
    const lean = await failure(agentUnary(clients.session(gone), ProcessService.method.execute, { command: "ok" }, opts));
    clients.forget(gone.key);
    const ref = await failure(clients.client(ProcessService, gone).execute({ command: "ok" }, opts));
    clients.forget(gone.key);
    expect(lean).toBeInstanceOf(ConnectError);
    expect(lean.code).toBe(ref.code);
  });
});
