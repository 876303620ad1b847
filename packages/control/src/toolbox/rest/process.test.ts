import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually } from "../../../../protocol/src/testing/eventually.ts";
import { legacyWrapped, splitWords } from "./execute.ts";
import { PREFIXES, startFixture, toolboxFetch, type Fixture } from "./test-fixture.ts";
import type { UntypedJson } from "../../casts.ts";

// process/execute and process/code-run through the REST toolbox into a real agent, with the
// command forms of each SDK generation.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture();
});
afterAll(async () => f?.stop());

const b64 = (s: string) => Buffer.from(s).toString("base64");

/** The command SDKs 0.25 – 0.154 send for executeCommand(command, cwd, env). */
function sdkWrapped(command: string, env?: Record<string, string>): string {
  let c = `echo '${b64(command)}' | base64 -d | sh`;
  if (env && Object.keys(env).length > 0) c = `${Object.entries(env).map(([k, v]) => `export ${k}=$(echo '${b64(v)}' | base64 -d)`).join(";")}; ${c}`;
  return `sh -c "${c}"`;
}

async function execute(body: unknown, headers: Record<string, string> = {}, prefix?: string) {
  const res = await toolboxFetch(f, "/process/execute", { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json", ...headers }, prefix });
  return { status: res.status, body: (await res.json() as UntypedJson) };
}

const TRICKY = {
  QUOTES: `it's "double" and 'single'`,
  DOLLARS: "$HOME ${PATH} $(echo injected) `echo tick` \\$ \\",
  SPACES: "  leading and trailing  ",
  NEWLINE: "line1\nline2",
};

describe("execute", () => {
  it.each([
    ["no version header", {}],
    ["SDK 0.25.6", { "x-daytona-sdk-version": "0.25.6" }],
    ["SDK 0.111.1", { "x-daytona-sdk-version": "0.111.1" }],
  ])("runs the legacy base64 wrapper exactly, env values with quotes and $ intact (%s)", async (_name, headers) => {
    const command = `printf '[%s]' "$QUOTES" "$DOLLARS" "$SPACES" "$NEWLINE"; echo; echo "it's $(echo nested) \\"ok\\""`;
    for (const prefix of PREFIXES) {
      const res = await execute({ command: sdkWrapped(command, TRICKY), cwd: f.root }, headers, prefix);
      expect(res.status).toBe(200);
      expect(res.body).toEqual({ exitCode: 0, result: `[${TRICKY.QUOTES}][${TRICKY.DOLLARS}][${TRICKY.SPACES}][${TRICKY.NEWLINE}]\nit's nested "ok"\n` });
    }
  });

  it("keeps the exit code and stderr of a wrapped command", async () => {
    const res = await execute({ command: sdkWrapped("echo out; echo err >&2; exit 7") }, { "x-daytona-sdk-version": "0.111.1" });
    expect(res.body.exitCode).toBe(7);
    expect(res.body.result.split("\n").sort()).toEqual(["", "err", "out"]);
  });

  it("runs newer SDKs' raw commands as shell scripts with envs", async () => {
    const res = await execute({ command: `printf '[%s]' "$QUOTES" "$DOLLARS"; echo; echo a | tr a b`, envs: TRICKY }, { "x-daytona-sdk-version": "0.218.0" });
    expect(res.body).toEqual({ exitCode: 0, result: `[${TRICKY.QUOTES}][${TRICKY.DOLLARS}]\nb\n` });
    // A modern client's own `sh -c "…"` keeps shell semantics (escapes work).
    const own = await execute({ command: 'sh -c "echo \\"hi\\""' }, { "x-daytona-sdk-version": "0.218.0" });
    expect(own.body).toEqual({ exitCode: 0, result: "hi\n" });
  });

  it("answers 408 command execution timeout and kills the command", async () => {
    const marker = `${f.root}/timeout-marker`;
    const gate = `${f.root}/timeout-gate`;
    const pidFile = `${f.root}/timeout-pid`;
    // The command waits for a gate only this test opens: the 408 came while it was still running.
    const res = await execute({ command: sdkWrapped(`echo $$ > ${pidFile}; until [ -e ${gate} ]; do sleep 0.05; done; touch ${marker}`), timeout: 1 }, { "x-daytona-sdk-version": "0.111.1" });
    expect(res.status).toBe(408);
    expect(res.body).toMatchObject({ statusCode: 408, message: "command execution timeout" });
    // Open the gate: a command still alive would now leave its marker; a killed one is gone.
    const sh = async (command: string) => (await execute({ command }, { "x-daytona-sdk-version": "0.218.0" })).body.result as string;
    expect(await sh(`touch ${gate}; cat ${pidFile}`)).toMatch(/^\d+\n$/);
    await eventually("the timed-out command to be gone", async () => (await sh(`kill -0 $(cat ${pidFile}) 2>/dev/null && echo alive || echo gone`)) === "gone\n");
    expect(await sh(`test -e ${marker} && echo exists || echo gone`)).toBe("gone\n");
  });

  it("refuses a blank command and a caller without credentials", async () => {
    expect((await execute({ command: "  " })).status).toBe(400);
    const res = await toolboxFetch(f, "/process/execute", { method: "POST", body: "{}", headers: { authorization: "Bearer wrong" } });
    expect(res.status).toBe(401);
  });
});

describe("legacy command splitting", () => {
  it("splits on spaces outside quotes, without escapes, as the reference daemon did", () => {
    expect(splitWords(`sh -c "a 'b' c"`)).toEqual(["sh", "-c", "a 'b' c"]);
    expect(splitWords(`a  'b c'"d e" f`)).toEqual(["a", "b cd e", "f"]);
    expect(splitWords(`x ''`)).toEqual(["x", ""]);
    expect(legacyWrapped(`sh -c "echo '$(echo x)'"`)).toBe(`'sh' '-c' 'echo '\\''$(echo x)'\\'''`);
    expect(legacyWrapped("echo hi")).toBeUndefined();
    expect(legacyWrapped(`sh -c "a" "b"`)).toBeUndefined();
  });
});

describe("code-run", () => {
  it("runs python code with argv and envs", async () => {
    const res = await toolboxFetch(f, "/process/code-run", {
      method: "POST",
      body: JSON.stringify({ code: "import os, sys\nprint(sys.argv[1:], os.environ['GREETING'])", language: "python", argv: ["a", "b"], envs: { GREETING: "it's $x" } }),
      headers: { "content-type": "application/json", "x-daytona-sdk-version": "0.218.0" },
    });
    expect(res.status).toBe(200);
    expect((await res.json() as UntypedJson)).toMatchObject({ exitCode: 0, result: "['a', 'b'] it's $x\n" });
  });
});
