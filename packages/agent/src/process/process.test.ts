import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { CodeLanguage, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import { mkdir } from "node:fs/promises";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";
import { httpStatusOf } from "@sandbar/protocol";

let agent: AgentProcess;
let proc: ReturnType<typeof agent.client<typeof ProcessService>>;
beforeAll(async () => {
  agent = await startAgentProcess();
  proc = agent.client(ProcessService);
});
afterAll(async () => {
  await agent?.stop();
});

const codeOf = async (p: Promise<unknown>) => {
  const err = await p.then(() => undefined, (e: unknown) => ConnectError.from(e));
  return err?.code;
};

/** Running: present and not a zombie. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat[stat.lastIndexOf(")") + 2] !== "Z";
  } catch {
    return false;
  }
}

describe("execute", () => {
  it("runs a shell script in the work dir and returns its exit code and interleaved output", async () => {
    const res = await proc.execute({ command: "echo one; echo two >&2; echo three; pwd; exit 7" });
    expect(res.exitCode).toBe(7);
    expect(res.result).toBe(`one\ntwo\nthree\n${agent.root}\n`);
  });

  it("takes cwd and env, and shell syntax (pipes, quotes, several lines)", async () => {
    await mkdir(path.join(agent.root, "sub"));
    const res = await proc.execute({
      command: `printf '%s|%s\\n' "$GREETING" "$(basename "$PWD")" | tr a-z A-Z\nif true; then echo "it's"; fi`,
      cwd: "sub",
      envs: { GREETING: `hello "world" $x` },
    });
    expect(res).toMatchObject({ exitCode: 0, result: `HELLO "WORLD" $X|SUB\nit's\n` });
  });

  it("runs a script longer than one argv entry may be", async () => {
    const lines = Array.from({ length: 20000 }, (_, i) => `x${i}=${"a".repeat(10)}`).join("\n");
    const res = await proc.execute({ command: `${lines}\necho "$x19999"` });
    expect(res).toMatchObject({ exitCode: 0, result: "aaaaaaaaaa\n" });
  });

  it("kills the whole process group past the timeout with DEADLINE_EXCEEDED (REST 408)", async () => {
    const pidFile = path.join(agent.root, "bg.pid");
    const started = Date.now();
    const err = await proc
      .execute({ command: `sleep 30 & echo $! > ${pidFile}; sleep 30`, timeout: 1 })
      .then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(err?.code).toBe(Code.DeadlineExceeded);
    expect(httpStatusOf(err!.code)).toBe(408);
    expect(err?.rawMessage).toMatch(/timeout/);
    expect(Date.now() - started).toBeLessThan(5000);
    const { readFile } = await import("node:fs/promises");
    const bgPid = Number((await readFile(pidFile, "utf8")).trim());
    await new Promise((r) => setTimeout(r, 100));
    expect(alive(bgPid)).toBe(false);
  });

  it("does not wait for background processes that keep its output open", async () => {
    const started = Date.now();
    const res = await proc.execute({ command: "sleep 5 & echo started" });
    expect(res).toMatchObject({ exitCode: 0, result: "started\n" });
    expect(Date.now() - started).toBeLessThan(3000);
  });

  it("answers the same whether its shell was started for it or ahead of time", async () => {
    // The first call of a kind starts its shell cold; later ones get a warm spare.
    const cases: [string, number, RegExp | string][] = [
      ["exit 3", 3, ""],
      ["set -e; false; echo unreachable", 1, ""],
      ["if then", 2, /syntax error/],
      ["echo \"$0|$#\"; cd /; pwd", 0, /^\/(usr\/)?bin\/bash\|0\n\/\n$/],
      ["read line; echo \"[$line]\"", 0, "[]\n"],
      ["printf 'a\\0b' | od -c | head -1", 0, /a\s+\\0\s+b/],
    ];
    for (const [command, exitCode, result] of cases) {
      for (let round = 0; round < 3; round++) {
        const res = await proc.execute({ command, envs: round === 2 ? { EXTRA: "1" } : {}, cwd: round === 1 ? "/tmp" : undefined });
        expect(res.exitCode, `${command} (round ${round})`).toBe(exitCode);
        if (typeof result === "string") expect(res.result).toBe(result);
        else expect(res.result).toMatch(result);
      }
    }
  });

  it("starts the spawner after a lone first execution has answered, and at once for executions side by side", async () => {
    // The agent's children as an execution sees them (its shell's parent is the agent then); the
    // spawner is known by its program (node -e, with process.send in it; the pattern does not match itself).
    const isSpawner = (pid: string) => `grep -qa 'process[.]sen[d]' /proc/${pid}/cmdline && echo spawner`;
    const children = `for p in $(cat /proc/$PPID/task/*/children); do ${isSpawner("$p")} || cat /proc/$p/comm; done`;
    const spawnerIn = (out: string) => out.split("\n").includes("spawner");
    const lone = await startAgentProcess();
    const sideBySide = await startAgentProcess();
    try {
      const first = lone.client(ProcessService);
      const before = await first.execute({ command: children });
      expect(before.result).toMatch(/sh\n/); // this execution's own shell
      expect(spawnerIn(before.result)).toBe(false);
      // After its answer the spawner starts, and executions come to run in its shells.
      let seen = false;
      for (let i = 0; i < 40 && !seen; i++) {
        await new Promise((r) => setTimeout(r, 50));
        seen = (await first.execute({ command: isSpawner("$PPID") })).result === "spawner\n";
      }
      expect(seen).toBe(true);

      const both = sideBySide.client(ProcessService);
      const long = both.execute({ command: "sleep 1" });
      await new Promise((r) => setTimeout(r, 200));
      expect(spawnerIn((await both.execute({ command: children })).result)).toBe(true);
      expect((await long).exitCode).toBe(0);
    } finally {
      await lone.stop();
      await sideBySide.stop();
    }
  });

  it("runs executions in shells the spawner started, and keeps executing when user code kills the spawner", async () => {
    const parentOfShell = async () => {
      const res = await proc.execute({ command: 'echo $PPID; tr "\\0" " " < /proc/$PPID/cmdline | head -c 100' });
      const [ppid, cmdline] = res.result.split("\n", 2);
      return { spawner: cmdline!.includes(" -e "), ppid: Number(ppid) };
    };
    // A few executions for the spawner to start and fill its pool.
    let parent = await parentOfShell();
    for (let i = 0; i < 20 && !parent.spawner; i++) {
      await new Promise((r) => setTimeout(r, 50));
      parent = await parentOfShell();
    }
    expect(parent.spawner).toBe(true);

    // Killed from inside an execution: that execution ends killed, the next ones run.
    const killed = await proc.execute({ command: `kill -9 ${parent.ppid}; sleep 5` });
    expect(killed.exitCode).toBe(137);
    for (let i = 0; i < 5; i++) expect(await proc.execute({ command: "echo $((40 + 2))" })).toMatchObject({ exitCode: 0, result: "42\n" });
    expect(alive(parent.ppid)).toBe(false);

    // It comes back (not sooner than 5 s after its last start).
    const until = Date.now() + 15_000;
    let back = await parentOfShell();
    while (!(back.spawner && back.ppid !== parent.ppid) && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 250));
      back = await parentOfShell();
    }
    expect(back.spawner).toBe(true);
    expect(back.ppid).not.toBe(parent.ppid);
  }, 30_000);

  it("never runs an execution in a shell started before the environment changed", async () => {
    const env = agent.client(EnvironmentService);
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 5; i++) await proc.execute({ command: "true" }); // spares ready
      await env.setEnvironment({ env: { ROUND: String(round) } });
      for (let i = 0; i < 4; i++) expect((await proc.execute({ command: 'echo "$ROUND"' })).result).toBe(`${round}\n`);
    }
  });

  it("refuses bad input with clear errors", async () => {
    expect(await codeOf(proc.execute({ command: "  " }))).toBe(Code.InvalidArgument);
    expect(await codeOf(proc.execute({ command: "true", cwd: "/no/such/dir" }))).toBe(Code.NotFound);
    expect(await codeOf(proc.execute({ command: "true", envs: { "BAD-NAME": "x" } }))).toBe(Code.InvalidArgument);
  });
});

describe("code-run", () => {
  it("runs python with argv and env", async () => {
    const res = await proc.codeRun({ code: "import sys, os\nprint(sys.argv[1:], os.environ['K'])", argv: ["a b", "c"], envs: { K: "v" } });
    expect(res).toMatchObject({ exitCode: 0, result: "['a b', 'c'] v\n" });
  });

  it("runs javascript and typescript with node", async () => {
    const js = await proc.codeRun({ code: "console.log(process.argv.slice(1).join(','))", language: CodeLanguage.JAVASCRIPT, argv: ["x", "y"] });
    expect(js).toMatchObject({ exitCode: 0, result: "x,y\n" });
    const ts = await proc.codeRun({ code: "enum E { A = 2 }\nconst n: number = E.A * 21;\nconsole.log(n)", language: CodeLanguage.TYPESCRIPT });
    expect(ts).toMatchObject({ exitCode: 0, result: "42\n" });
  });

  it("splits chart artifacts out of the output", async () => {
    const chart = { type: "line", title: "t", elements: [] };
    const res = await proc.codeRun({ code: `print("before")\nprint('dtn_artifact_k39fd2:' + ${JSON.stringify(JSON.stringify({ type: "chart", value: chart }))})\nprint("after")` });
    expect(res.result).toBe("before\nafter\n");
    expect(res.artifacts?.charts).toEqual([chart]);
  });
});
