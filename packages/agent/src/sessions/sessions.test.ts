import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

let agent: AgentProcess;
let proc: ReturnType<typeof agent.client<typeof ProcessService>>;
beforeAll(async () => {
  agent = await startAgentProcess();
  proc = agent.client(ProcessService);
});
afterAll(async () => {
  await agent?.stop();
});

type Chunks = { chunks: Array<{ data: { case: string | undefined; value?: unknown } }> };
/** One stream's text from a unary answer's typed chunks. */
const text = (r: Chunks, stream: "stdout" | "stderr") =>
  Buffer.concat(r.chunks.filter((c) => c.data.case === stream).map((c) => Buffer.from(c.data.value as Uint8Array))).toString();

const codeOf = async (p: Promise<unknown>) => (await p.then(() => undefined, (e: unknown) => ConnectError.from(e)))?.code;

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat[stat.lastIndexOf(")") + 2] !== "Z";
  } catch {
    return false;
  }
}

async function follow(sessionId: string, commandId: string) {
  let stdout = "";
  let stderr = "";
  const dec = { out: new TextDecoder(), err: new TextDecoder() };
  for await (const chunk of proc.streamSessionCommandLogs({ sessionId, commandId, follow: true })) {
    if (chunk.data.case === "stdout") stdout += dec.out.decode(chunk.data.value, { stream: true });
    if (chunk.data.case === "stderr") stderr += dec.err.decode(chunk.data.value, { stream: true });
  }
  return { stdout, stderr };
}

describe("sessions", () => {
  it("keeps shell state (cd, export, variables, functions) across commands", async () => {
    await proc.createSession({ sessionId: "state" });
    await proc.sessionExecute({ sessionId: "state", command: "mkdir -p deep/er && cd deep/er && export FOO=bar; BAZ=qux; greet() { echo \"hi $1\"; }" });
    const res = await proc.sessionExecute({ sessionId: "state", command: 'pwd; echo "$FOO $BAZ"; greet you; sh -c \'echo child sees $FOO\'' });
    expect(res.exitCode).toBe(0);
    expect(text(res, "stdout")).toBe(`${agent.root}/deep/er\nbar qux\nhi you\nchild sees bar\n`);
  });

  it("answers typed stdout and stderr chunks in the order written, and the exit code", async () => {
    await proc.createSession({ sessionId: "split" });
    const res = await proc.sessionExecute({ sessionId: "split", command: "echo hi; echo oops >&2; printf partial; exit_code_of() { return 3; }; exit_code_of" });
    expect(res.exitCode).toBe(3);
    expect(text(res, "stdout")).toBe("hi\npartial");
    expect(text(res, "stderr")).toBe("oops\n");
    // Consecutive chunks of one stream are joined: no two neighbours share a stream.
    expect(res.chunks.every((c, i) => i === 0 || c.data.case !== res.chunks[i - 1]!.data.case)).toBe(true);
    const logs = await proc.getSessionCommandLogs({ sessionId: "split", commandId: res.cmdId });
    expect(logs).toMatchObject({ chunks: res.chunks, truncated: false });
    const cmd = await proc.getSessionCommand({ sessionId: "split", commandId: res.cmdId });
    expect(cmd).toMatchObject({ id: res.cmdId, exitCode: 3 });
  });

  it("survives a command that redirects or closes the shell's output, or has a syntax error", async () => {
    await proc.createSession({ sessionId: "robust" });
    await proc.sessionExecute({ sessionId: "robust", command: "exec >/dev/null 2>&1 3>&-" });
    const bad = await proc.sessionExecute({ sessionId: "robust", command: "if then fi (" });
    expect(bad.exitCode).not.toBe(0);
    const res = await proc.sessionExecute({ sessionId: "robust", command: "echo still here" });
    expect(res.exitCode).toBe(0);
    expect(text(res, "stdout")).toBe("still here\n");
  });

  it("returns at once for an asynchronous command, and its follow stream ends when it exits", async () => {
    await proc.createSession({ sessionId: "async" });
    // The command holds its last line until the test opens the gate: the answer cannot wait for it.
    const gate = path.join(agent.root, "async.gate");
    const { cmdId, exitCode, chunks } = await proc.sessionExecute({
      sessionId: "async",
      command: `echo out1; echo err1 >&2; echo out2; echo err2 >&2; until [ -e ${gate} ]; do sleep 0.05; done; echo out3; echo err3 >&2; exit 4`,
      runAsync: true,
    });
    expect(exitCode).toBeUndefined();
    expect(chunks).toEqual([]);
    expect((await proc.getSessionCommand({ sessionId: "async", commandId: cmdId })).exitCode).toBeUndefined();
    // The follow stream is open while the command runs, and ends with its last output once it exits.
    let followed = false;
    const following = follow("async", cmdId).finally(() => (followed = true));
    await eventually("the first lines", async () => text(await proc.getSessionCommandLogs({ sessionId: "async", commandId: cmdId }), "stdout") === "out1\nout2\n");
    expect(followed).toBe(false);
    await writeFile(gate, "");
    const logs = await following;
    expect(logs).toEqual({ stdout: "out1\nout2\nout3\n", stderr: "err1\nerr2\nerr3\n" });
    expect((await proc.getSessionCommand({ sessionId: "async", commandId: cmdId })).exitCode).toBe(4);
    const session = await proc.getSession({ sessionId: "async" });
    expect(session.commands.map((c) => [c.id, c.exitCode])).toEqual([[cmdId, 4]]);
  });

  it("runs commands of a session one after another, async ones too", async () => {
    await proc.createSession({ sessionId: "queue" });
    const a = await proc.sessionExecute({ sessionId: "queue", command: "sleep 0.3; echo a > order", runAsync: true });
    const b = await proc.sessionExecute({ sessionId: "queue", command: "echo b >> order; cat order" });
    expect(text(b, "stdout")).toBe("a\nb\n");
    expect((await proc.getSessionCommand({ sessionId: "queue", commandId: a.cmdId })).exitCode).toBe(0);
  });

  it("passes input to an asynchronous command and echoes it into the log", async () => {
    await proc.createSession({ sessionId: "input" });
    const { cmdId } = await proc.sessionExecute({ sessionId: "input", command: "read name; echo \"hello $name\"", runAsync: true });
    await proc.sendSessionCommandInput({ sessionId: "input", commandId: cmdId, data: "world" });
    const logs = await follow("input", cmdId);
    expect(logs.stdout).toBe("world\nhello world\n");
    expect(await codeOf(proc.sendSessionCommandInput({ sessionId: "input", commandId: cmdId, data: "late" }))).toBe(Code.FailedPrecondition);
  });

  it("delete kills what runs in the session and ends its follow stream", async () => {
    await proc.createSession({ sessionId: "doomed" });
    const { cmdId } = await proc.sessionExecute({ sessionId: "doomed", command: "sleep 300 & echo $!; trap '' TERM; sleep 301", runAsync: true });
    const followed = follow("doomed", cmdId);
    let pid = 0;
    await eventually("the background pid", async () => (pid = Number(text(await proc.getSessionCommandLogs({ sessionId: "doomed", commandId: cmdId }), "stdout").trim())) > 0);
    expect(alive(pid)).toBe(true);
    await proc.deleteSession({ sessionId: "doomed" });
    await followed;
    expect(alive(pid)).toBe(false);
    expect(await codeOf(proc.getSession({ sessionId: "doomed" }))).toBe(Code.NotFound);
    expect((await proc.listSessions({})).sessions.map((s) => s.sessionId)).not.toContain("doomed");
  });

  it("follows a command printing 100 MB to its end", async () => {
    await proc.createSession({ sessionId: "big" });
    const { cmdId } = await proc.sessionExecute({
      sessionId: "big",
      command: "head -c 100000000 /dev/zero | tr '\\0' 'x'; echo; echo done >&2",
      runAsync: true,
    });
    let stdoutBytes = 0;
    let stderr = "";
    for await (const chunk of proc.streamSessionCommandLogs({ sessionId: "big", commandId: cmdId, follow: true })) {
      if (chunk.data.case === "stdout") stdoutBytes += chunk.data.value.length;
      if (chunk.data.case === "stderr") stderr += Buffer.from(chunk.data.value).toString();
    }
    expect(stdoutBytes).toBe(100_000_001);
    expect(stderr).toBe("done\n");
    expect((await proc.getSessionCommand({ sessionId: "big", commandId: cmdId })).exitCode).toBe(0);
    // The unary answer is bounded and says so.
    const logs = await proc.getSessionCommandLogs({ sessionId: "big", commandId: cmdId });
    expect(logs.truncated).toBe(true);
    expect(text(logs, "stdout").length).toBe(16 * 1024 * 1024);
  }, 120_000);

  it("ends the session when its shell exits, and says so", async () => {
    await proc.createSession({ sessionId: "exiting" });
    const res = await proc.sessionExecute({ sessionId: "exiting", command: "echo bye; exit 5" });
    expect(res.exitCode).toBe(5);
    expect(text(res, "stdout")).toBe("bye\n");
    expect(await codeOf(proc.sessionExecute({ sessionId: "exiting", command: "true" }))).toBe(Code.FailedPrecondition);
  });

  it("refuses bad input with clear errors", async () => {
    expect(await codeOf(proc.createSession({ sessionId: "" }))).toBe(Code.InvalidArgument);
    await proc.createSession({ sessionId: "dup" });
    expect(await codeOf(proc.createSession({ sessionId: "dup" }))).toBe(Code.AlreadyExists);
    expect(await codeOf(proc.sessionExecute({ sessionId: "nope", command: "true" }))).toBe(Code.NotFound);
    expect(await codeOf(proc.sessionExecute({ sessionId: "dup", command: " " }))).toBe(Code.InvalidArgument);
    expect(await codeOf(proc.getSessionCommand({ sessionId: "dup", commandId: "nope" }))).toBe(Code.NotFound);
    expect(await codeOf(proc.deleteSession({ sessionId: "nope" }))).toBe(Code.NotFound);
    const err = await proc.getSession({ sessionId: "nope" }).catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).rawMessage).toBe("session not found: nope");
  });
});
