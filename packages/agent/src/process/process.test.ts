import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { CodeLanguage, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import { mkdir, writeFile } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
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
  /**
   * Shell code printing "host <pid>" when the execution runs in a subshell of a host (its
   * parent is the host bash, or a job whose parent is the host bash), else "own". No `$$` or PPID in it: those
   * send a script to a shell of its own. ($BASHPID is read outside `$(...)`, which is a subshell.)
   */
  const whereItRuns =
    'me=$BASHPID; job=$(awk \'{print $4}\' /proc/$me/stat); host=$(awk \'{print $4}\' /proc/$job/stat); ' +
    'if grep -qa __sandbar_slot /proc/$job/cmdline; then host=$job; fi; ' +
    'if grep -qa __sandbar_slot /proc/$host/cmdline; then echo "host $host"; else echo own; fi';
  const hostOf = async (client: typeof proc) => (await client.execute({ command: whereItRuns })).result.trim();
  const untilHost = async (client: typeof proc) => {
    let where = "own";
    await eventually("a host shell to be ready", async () => (where = await hostOf(client)) !== "own");
    return where;
  };

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
    expect(await untilHost(proc)).toMatch(/^host/);
    const pidFile = path.join(agent.root, "bg.pid");
    // Both sleeps outlast the test's own timeout: an answer at all means the 1 s deadline ended them.
    const err = await proc
      .execute({ command: `sleep 600 & echo $! > ${pidFile}; sleep 600`, timeout: 1 })
      .then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(err?.code).toBe(Code.DeadlineExceeded);
    expect(httpStatusOf(err!.code)).toBe(408);
    expect(err?.rawMessage).toMatch(/timeout/);
    const { readFile } = await import("node:fs/promises");
    const bgPid = Number((await readFile(pidFile, "utf8")).trim());
    await eventually("the background job to be killed with its group", () => !alive(bgPid));
  });

  it("does not wait for background processes that keep its output open", async () => {
    const res = await proc.execute({ command: "sleep 600 & echo $!" });
    expect(res.exitCode).toBe(0);
    // The answer came while the job that holds its output open is still running.
    const bgPid = Number(res.result.trim());
    expect(alive(bgPid)).toBe(true);
    process.kill(bgPid, "SIGKILL");
  });

  it("answers the same whether its shell was started for it or ahead of time", async () => {
    // The first call runs in a shell of its own; later ones in subshells of a host.
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

  it("runs a lone first execution in a shell of its own, later ones in subshells of a host", async () => {
    const lone = await startAgentProcess();
    try {
      const client = lone.client(ProcessService);
      expect(await hostOf(client)).toBe("own");
      expect(await untilHost(client)).toMatch(/^host \d+$/);
    } finally {
      await lone.stop();
    }
  });

  it("gives scripts that ask for $$ or $PPID a shell of their own, so they name it", async () => {
    await untilHost(proc);
    const res = await proc.execute({ command: 'echo "$$ $BASHPID"; [ "$(awk \'{print $4}\' /proc/$$/stat)" = "$PPID" ] && echo parent-ok' });
    const [pids, parent] = res.result.split("\n");
    const [dollar, bashpid] = pids!.split(" ");
    expect(dollar).toBe(bashpid);
    expect(parent).toBe("parent-ok");
  });

  it("leaves a subshell nothing of its host: no variables, no other execution's pipes", async () => {
    expect(await untilHost(proc)).toMatch(/^host/);
    const res = await proc.execute({ command: "set | grep -c '^__sandbar_[a-z]*=' ; for f in /proc/$BASHPID/fd/*; do echo \"${f##*/} $(readlink $f)\"; done" });
    const [vars, ...fds] = res.result.trim().split("\n");
    // __sandbar_script (the script itself) is the one left, as in a shell started ahead of time.
    expect(vars).toBe("1");
    // stdin /dev/null, stdout and stderr its slot's output; of the host's sockets (requests, other
    // slots, its own status) nothing. Descriptors the agent itself inherited are not ours to judge.
    const sockets = fds.filter((l) => l.includes("socket:"));
    expect(fds).toContain("0 /dev/null");
    expect(sockets.map((l) => l.split(" ")[0])).toEqual(["1", "2"]);
  });

  it("runs executions one after another as children of a host (one fork each), and one side by side with a running one at once", async () => {
    expect(await untilHost(proc)).toMatch(/^host/);
    const parent = "me=$BASHPID; p=$(awk '{print $4}' /proc/$me/stat); grep -qa __sandbar_slot /proc/$p/cmdline && echo child-of-host";
    // Past a host's slots too: the next one is ready.
    for (let i = 0; i < 2 * 16 + 2; i++) expect((await proc.execute({ command: parent })).result).toBe("child-of-host\n");
    // The sequential host is busy with the long one (held until the gate opens): the other must not wait for it.
    const began = path.join(agent.root, "long.began");
    const gate = path.join(agent.root, "long.gate");
    let longDone = false;
    const long = proc.execute({ command: `touch ${began}; while [ ! -e ${gate} ]; do sleep 0.05; done; echo long` }).finally(() => (longDone = true));
    await eventually("the long execution to start", () => existsSync(began));
    const quick = await proc.execute({ command: "echo quick" });
    expect(quick).toMatchObject({ exitCode: 0, result: "quick\n" });
    expect(longDone).toBe(false);
    await writeFile(gate, "");
    expect(await long).toMatchObject({ exitCode: 0, result: "long\n" });
  });

  it("runs more executions side by side than a host has slots, each with its own output and status", async () => {
    await untilHost(proc);
    const runs = await Promise.all(Array.from({ length: 40 }, (_, i) => proc.execute({ command: `sleep 0.$((${i} % 3)); echo out-${i}; echo err-${i} >&2; exit ${i % 7}` })));
    runs.forEach((r, i) => expect(r).toMatchObject({ exitCode: i % 7, result: `out-${i}\nerr-${i}\n` }));
  });

  it("keeps executing when user code kills its host, and starts another", async () => {
    expect(await untilHost(proc)).toMatch(/^host/);
    // The execution killing its own host is a process group of its own: it goes on.
    const killer = await proc.execute({ command: `${whereItRuns}; kill -9 $host; sleep 0.2; echo survived` });
    const [where, said] = killer.result.split("\n");
    expect(where).toMatch(/^host \d+$/);
    expect(said).toBe("survived");
    // Executions right after, and side by side: none is lost.
    const after = await Promise.all(Array.from({ length: 8 }, () => proc.execute({ command: "echo $((40 + 2))" })));
    for (const r of after) expect(r).toMatchObject({ exitCode: 0, result: "42\n" });
    expect(alive(Number(where!.split(" ")[1]))).toBe(false);
    const next = await untilHost(proc);
    expect(next).toMatch(/^host \d+$/);
    expect(next).not.toBe(where);
  }, 30_000);

  it("reports an execution whose job was killed from inside as killed (137)", async () => {
    await untilHost(proc);
    // The job is the subshell's parent; killing it leaves no exit status to report.
    const res = await proc.execute({ command: "me=$BASHPID; kill -9 $(awk '{print $4}' /proc/$me/stat); sleep 0.2; echo gone-on" });
    expect(res.exitCode).toBe(137);
  });

  it("gives executions the environment as changed after their host started", async () => {
    const env = agent.client(EnvironmentService);
    for (let round = 0; round < 3; round++) {
      expect(await untilHost(proc)).toMatch(/^host/);
      await env.setEnvironment({ env: { ROUND: String(round) } });
      for (let i = 0; i < 4; i++) expect((await proc.execute({ command: 'echo "$ROUND"' })).result).toBe(`${round}\n`);
    }
  });

  it("runs in the work dir as it is now, after it was removed and made again under a running host", async () => {
    expect(await untilHost(proc)).toMatch(/^host/);
    const root = agent.root;
    expect(await proc.execute({ command: `rm -rf ${root} && mkdir ${root} && echo fresh > ${root}/marker && echo ok` })).toMatchObject({ exitCode: 0, result: "ok\n" });
    expect(await untilHost(proc)).toMatch(/^host/);
    expect(await proc.execute({ command: "cat marker; pwd" })).toMatchObject({ exitCode: 0, result: `fresh\n${root}\n` });
  });

  it("gives env named like bash's read-only variables what a new bash gives them, per call and set on the agent", async () => {
    const command = 'echo "$FOO $UID"; env | grep -c "^UID=4242$"';
    expect(await untilHost(proc)).toMatch(/^host/);
    expect(await proc.execute({ command, envs: { UID: "4242", FOO: "bar" } })).toMatchObject({ exitCode: 0, result: "bar 4242\n1\n" });
    // Set on the agent (a warm-pool claim): the hosts started before it are retired.
    await agent.client(EnvironmentService).setEnvironment({ env: { UID: "4242", FOO: "baz" } });
    for (let i = 0; i < 3; i++) expect(await proc.execute({ command })).toMatchObject({ exitCode: 0, result: "baz 4242\n1\n" });
    expect(await untilHost(proc)).toMatch(/^host/);
    expect(await proc.execute({ command })).toMatchObject({ exitCode: 0, result: "baz 4242\n1\n" });
  });

  it("sources a BASH_ENV given with an execution, as a new bash does", async () => {
    await writeFile(path.join(agent.root, "env.sh"), "greet() { echo hello-from-bash-env; }\n");
    expect(await untilHost(proc)).toMatch(/^host/);
    expect(await proc.execute({ command: "greet", envs: { BASH_ENV: path.join(agent.root, "env.sh") } })).toMatchObject({ exitCode: 0, result: "hello-from-bash-env\n" });
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
