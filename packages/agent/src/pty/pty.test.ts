import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import type { PtyExit } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

let agent: AgentProcess;
let pty: ReturnType<typeof agent.client<typeof PtyService>>;
beforeAll(async () => {
  agent = await startAgentProcess();
  pty = agent.client(PtyService);
});
afterAll(async () => {
  await agent?.stop();
});

const codeOf = async (p: Promise<unknown>) => (await p.then(() => undefined, (e: unknown) => ConnectError.from(e)))?.code;

/** Attaches to a terminal and collects its output as text. */
function attach(sessionId: string) {
  let text = "";
  let connected = false;
  let exit: PtyExit | undefined;
  const waiters: (() => void)[] = [];
  const notify = () => waiters.splice(0).forEach((w) => w());
  const done = (async () => {
    const dec = new TextDecoder();
    for await (const ev of pty.connectPty({ sessionId })) {
      if (ev.event.case === "connected") connected = true;
      if (ev.event.case === "data") text += dec.decode(ev.event.value, { stream: true });
      if (ev.event.case === "exit") exit = ev.event.value;
      notify();
    }
    notify();
  })();
  return {
    done,
    get connected() {
      return connected;
    },
    get exit() {
      return exit;
    },
    get text() {
      return text;
    },
    async waitFor(re: RegExp, ms = 10_000): Promise<RegExpMatchArray> {
      const deadline = Date.now() + ms;
      for (;;) {
        const m = text.match(re);
        if (m) return m;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${re}; got:\n${text}`);
        await new Promise<void>((r) => {
          waiters.push(r);
          setTimeout(r, 100);
        });
      }
    },
  };
}

const send = (sessionId: string, s: string) => pty.sendPtyInput({ sessionId, data: Buffer.from(s) });

describe("pty", () => {
  it("runs the shell on a terminal of the given size; takes input and resize; reports the exit code", async () => {
    const { sessionId } = await pty.createPty({ id: "t1", cols: 100, rows: 30, lazyStart: true, envs: { GREETING: "héllo" } });
    expect(sessionId).toBe("t1");
    expect(await pty.getPty({ sessionId })).toMatchObject({ id: "t1", cols: 100, rows: 30, active: false, lazyStart: true, cwd: agent.root });
    const term = attach(sessionId);
    await term.waitFor(/./).catch(() => undefined);
    expect(term.connected).toBe(true);
    expect((await pty.getPty({ sessionId })).active).toBe(true);
    await send(sessionId, "stty size; echo \"[$TERM] $GREETING\"\r");
    await term.waitFor(/30 100/);
    await term.waitFor(/\[xterm-256color\] héllo/);
    const resized = await pty.resizePty({ sessionId, cols: 120, rows: 40 });
    expect(resized).toMatchObject({ cols: 120, rows: 40 });
    await send(sessionId, "stty size\r");
    await term.waitFor(/40 120/);
    await send(sessionId, "exit 3\r");
    await term.done;
    expect(term.exit).toMatchObject({ exitCode: 3, exitReason: "non-zero exit" });
    expect(await codeOf(pty.getPty({ sessionId }))).toBe(Code.NotFound);
  });

  it("delete kills the shell; clients see SIGKILL", async () => {
    await pty.createPty({ id: "t2", lazyStart: false });
    expect((await pty.getPty({ sessionId: "t2" })).active).toBe(true);
    expect((await pty.listPty({})).sessions.map((s) => s.id)).toContain("t2");
    const term = attach("t2");
    // The quotes keep the echoed input from matching: "sleeping" shows once the shell runs the line.
    await send("t2", "echo sl''eeping; sleep 1000\r");
    await term.waitFor(/sleeping/);
    await pty.deletePty({ sessionId: "t2" });
    await term.done;
    expect(term.exit).toMatchObject({ exitCode: 137, exitReason: "SIGKILL" });
    expect((await pty.listPty({})).sessions.map((s) => s.id)).not.toContain("t2");
  });

  it("refuses bad input with clear errors", async () => {
    expect(await codeOf(pty.createPty({ id: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(pty.createPty({ id: "big", cols: 1001, rows: 10 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(pty.createPty({ id: "cwd", cwd: "/no/such/dir" }))).toBe(Code.NotFound);
    await pty.createPty({ id: "dup", lazyStart: true });
    expect(await codeOf(pty.createPty({ id: "dup" }))).toBe(Code.AlreadyExists);
    expect(await codeOf(send("dup", "x"))).toBe(Code.FailedPrecondition);
    expect(await codeOf(pty.resizePty({ sessionId: "dup", cols: 0, rows: 10 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(send("nope", "x"))).toBe(Code.NotFound);
    expect(await codeOf(pty.deletePty({ sessionId: "nope" }))).toBe(Code.NotFound);
    await pty.deletePty({ sessionId: "dup" });
  });
});
