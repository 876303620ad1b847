/**
 * The `sandbar` CLI as scripts use it: a child process with pipes (no TTY) against a real
 * server (embedded PostgreSQL, real sandboxes). JSON output, exit codes, and the one-line
 * failures with what to do next (missing credentials, unreachable server, expired token,
 * revoked key, 429 with its Retry-After, usage mistakes), the stack trace only with --debug.
 */
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { startTestServer, type TestServer } from "@sandbar/control/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sandbar } from "./run-cli.ts";

let t: TestServer;
let dir: string;
let env: Record<string, string>;
let sandboxId: string;

/** A failure as the CLI must report it: exit code, exactly one line, no stack trace. */
function expectOneLine(r: { code: number; stderr: string; stdout: string }, code: number, pattern: RegExp) {
  expect(r.code).toBe(code);
  const lines = r.stderr.trimEnd().split("\n");
  expect(lines, r.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^sandbar: /);
  expect(lines[0]).toMatch(pattern);
  expect(r.stderr).not.toMatch(/\n\s+at /);
}

beforeAll(async () => {
  t = await startTestServer();
  dir = await mkdtemp(join(tmpdir(), "sandbar-cli-"));
  env = { SANDBAR_CONFIG_DIR: join(dir, "config"), SANDBAR_API_URL: `${t.url}/api` };
  const login = await sandbar(["login", "--api-key", t.adminKey], env);
  expect(login.code, login.stderr).toBe(0);
});

afterAll(async () => {
  await t?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("results", () => {
  it("login --api-key saves the key in a 0600 config file of the SDK's format; whoami --json reads it", async () => {
    const file = join(dir, "config", "config.json");
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const saved = JSON.parse(await readFile(file, "utf8"));
    expect(saved).toEqual({ version: 1, activeProfile: "default", profiles: { default: { apiUrl: `${t.url}/api`, apiKey: t.adminKey } } });
    const who = await sandbar(["whoami", "--json"], env);
    expect(who.code, who.stderr).toBe(0);
    expect(JSON.parse(who.stdout)).toMatchObject({ kind: "api-key", keyName: "sandbar-admin", organization: "Default", permissions: expect.arrayContaining(["write:sandboxes"]) });
  });

  it("sandbox create/list/get --json print the API's JSON; the table is for people", async () => {
    const created = await sandbar(["sandbox", "create", "--name", "cli-json", "-l", "team=cli", "--json"], env);
    expect(created.code, created.stderr).toBe(0);
    const sandbox = JSON.parse(created.stdout);
    expect(sandbox).toMatchObject({ name: "cli-json", state: "SANDBOX_STATE_STARTED", labels: { team: "cli" } });
    sandboxId = sandbox.id;
    const listed = JSON.parse((await sandbar(["sandbox", "list", "--json", "-l", "team=cli"], env)).stdout);
    expect(listed.map((s: { id: string }) => s.id)).toEqual([sandboxId]);
    expect(JSON.parse((await sandbar(["--json", "sandbox", "get", "cli-json"], env)).stdout).id).toBe(sandboxId);
    const table = await sandbar(["sandbox", "list"], env);
    expect(table.stdout.split("\n")[0]).toMatch(/^ID\s+NAME\s+STATE/);
    expect(table.stdout).toMatch(new RegExp(`${sandboxId}\\s+cli-json\\s+started`));
    // No colour codes in a pipe.
    expect(table.stdout).not.toContain("\x1b[");
  });

  it("exec passes the command's exit code through and keeps stdout and stderr apart", async () => {
    const r = await sandbar(["exec", sandboxId, "echo to-out; echo to-err >&2; exit 3"], env);
    expect(r).toEqual({ code: 3, stdout: "to-out\n", stderr: "to-err\n" });
    const words = await sandbar(["exec", sandboxId, "--", "sh", "-c", "printf '%s|' \"$0\" \"$1\"; exit 4", "a b", "it's"], env);
    expect(words).toMatchObject({ code: 4, stdout: "a b|it's|" });
    const ok = await sandbar(["exec", "--cwd", "/tmp", "-e", "GREETING=hi there", sandboxId, 'echo "$GREETING from $(pwd)"'], env);
    expect(ok).toMatchObject({ code: 0, stdout: "hi there from /tmp\n" });
  });

  it("logs prints a detached command's output; without -f it stops at the current end", async () => {
    const started = await sandbar(["exec", "--session", "bg", "-d", "--json", sandboxId, "echo first; sleep 0.3; echo second >&2"], env);
    expect(started.code, started.stderr).toBe(0);
    const { commandId } = JSON.parse(started.stdout);
    const followed = await sandbar(["logs", "-f", sandboxId, "bg", commandId], env);
    expect(followed).toMatchObject({ code: 0, stdout: "first\n", stderr: "second\n" });
    // The session's latest command by default.
    expect((await sandbar(["logs", sandboxId, "bg"], env)).stdout).toBe("first\n");
  });

  it("cp copies both ways, byte for byte, and draws no progress bar without a terminal", async () => {
    const local = join(dir, "up.bin");
    const data = randomBytes(3 * 1024 * 1024 + 17);
    await writeFile(local, data);
    const up = await sandbar(["cp", local, `${sandboxId}:/tmp/`], env);
    expect(up.code, up.stderr).toBe(0);
    expect(up.stderr).toBe(`Copied ${local} to ${sandboxId}:/tmp/up.bin.\n`);
    const back = join(dir, "down.bin");
    const down = await sandbar(["cp", "--json", `${sandboxId}:/tmp/up.bin`, back], env);
    expect(JSON.parse(down.stdout)).toMatchObject({ bytes: data.length, file: back });
    expect(down.stderr).toBe("");
    expect(Buffer.compare(await readFile(back), data)).toBe(0);
    // Into an existing directory named without a trailing slash, the name is kept too.
    const intoDir = await sandbar(["cp", "--json", local, `${sandboxId}:/tmp`], env);
    expect(intoDir.code, intoDir.stderr).toBe(0);
    expect(JSON.parse(intoDir.stdout)).toMatchObject({ path: "/tmp/up.bin", bytes: data.length });
    // A missing remote file leaves no local file behind.
    const missing = await sandbar(["cp", `${sandboxId}:/tmp/nope`, join(dir, "nope")], env);
    expectOneLine(missing, 1, /Not found: .*\/tmp\/nope/);
    await expect(stat(join(dir, "nope"))).rejects.toThrow();
  });

  it("changes lists a sandbox's changes (table and --json), prints its diff and writes its tar", async () => {
    expect((await sandbar(["exec", sandboxId, "mkdir -p /tmp/chg && echo hello > /tmp/chg/a.txt"], env)).code).toBe(0);
    const json = await sandbar(["changes", sandboxId, "--json", "--path", "/tmp/chg"], env);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout).map((c: { kind: string; type: string; path: string }) => `${c.kind} ${c.type} ${c.path}`)).toEqual(["added directory /tmp/chg", "added file /tmp/chg/a.txt"]);
    const table = await sandbar(["changes", sandboxId, "--path", "/tmp/chg"], env);
    expect(table.stdout.split("\n")[0]).toMatch(/^KIND\s+TYPE\s+SIZE\s+PATH/);
    expect(table.stdout).toMatch(/added\s+file\s+6\s+\/tmp\/chg\/a\.txt/);
    const diff = await sandbar(["changes", sandboxId, "--diff", "--path", "/tmp/chg"], env);
    expect(diff).toEqual({ code: 0, stdout: "--- /dev/null\n+++ b/tmp/chg/a.txt\n@@ -0,0 +1 @@\n+hello\n", stderr: "" });
    const tarFile = join(dir, "changes.tar");
    const tar = await sandbar(["changes", sandboxId, "--tar", tarFile, "--path", "/tmp/chg"], env);
    expect(tar.code, tar.stderr).toBe(0);
    expect(execFileSync("tar", ["-tf", tarFile]).toString()).toBe("tmp/chg/\ntmp/chg/a.txt\n");
    expectOneLine(await sandbar(["changes", sandboxId, "--since", "cp"], env), 1, /since: Snapshot cp not found/);
    expectOneLine(await sandbar(["changes", sandboxId, "--tar", "x", "--diff"], env), 2, /Choose one of --tar and --diff/);
  });

  it("volume, key and snapshot commands", async () => {
    const vol = JSON.parse((await sandbar(["volume", "create", "cli-vol", "--json"], env)).stdout);
    expect(vol.name).toBe("cli-vol");
    expect((await sandbar(["volume", "list"], env)).stdout).toMatch(/cli-vol\s+(ready|pending)/);
    expect((await sandbar(["volume", "delete", vol.id], env)).code).toBe(0);

    const key = JSON.parse((await sandbar(["key", "create", "ci", "-s", "write:sandboxes", "--expires-in", "2", "--json"], env)).stdout);
    expect(key).toMatchObject({ name: "ci", permissions: ["write:sandboxes"], value: expect.stringMatching(/^sbr_/) });
    // The new key works, with its scope.
    const withKey = { ...env, SANDBAR_API_KEY: key.value };
    expect(JSON.parse((await sandbar(["whoami", "--json"], withKey)).stdout)).toMatchObject({ keyName: "ci", permissions: ["write:sandboxes"] });
    expectOneLine(await sandbar(["key", "list"], withKey), 1, /^sandbar: Permission denied: .*scope/);
    expect((await sandbar(["key", "list"], env)).stdout).toMatch(/ci\s+sbr\*+\w{3}\s+write:sandboxes/);
    expect((await sandbar(["key", "delete", "ci"], env)).code).toBe(0);
    expectOneLine(await sandbar(["whoami"], withKey), 1, /credentials expired or were revoked.*sandbar login/);

    const snaps = JSON.parse((await sandbar(["snapshot", "list", "--json"], env)).stdout);
    expect(snaps.map((s: { name: string }) => s.name)).toContain("sandbar-default");
  });

  it("snapshot create follows the build log to its end; a failed build is one line and exit 1", async () => {
    // A registry nothing listens on: the pull fails at once, and its log says why.
    const r = await sandbar(["snapshot", "create", "cli-broken", "--image", "127.0.0.1:9/nothing:1", "--timeout", "60"], env);
    expect(r.stdout).toMatch(/^pulling 127\.0\.0\.1:9\/nothing:1$/m);
    expect(r.stdout).toMatch(/cannot reach the registry/);
    // A note that the build is followed, then the failure as one line.
    expect(r.code).toBe(1);
    expect(r.stderr.trimEnd().split("\n")).toEqual(["Building cli-broken from 127.0.0.1:9/nothing:1:", expect.stringMatching(/^sandbar: Snapshot cli-broken is error: cannot reach the registry/)]);
    expect((await sandbar(["snapshot", "logs", "cli-broken"], env)).stdout).toMatch(/^pulling /);
    expect((await sandbar(["snapshot", "delete", "cli-broken"], env)).code).toBe(0);
    const names = JSON.parse((await sandbar(["snapshot", "list", "--json"], env)).stdout).map((s: { name: string }) => s.name);
    expect(names).not.toContain("cli-broken");
  });
});

describe("failures are one line with what to do next", () => {
  it("no credentials", async () => {
    const r = await sandbar(["sandbox", "list"], { SANDBAR_CONFIG_DIR: join(dir, "empty"), SANDBAR_API_URL: `${t.url}/api` });
    expectOneLine(r, 1, /Not signed in to .*: run `sandbar login`/);
  });

  it("an unreachable server", async () => {
    const r = await sandbar(["sandbox", "list"], { ...env, SANDBAR_API_URL: "http://127.0.0.1:9/api" });
    expectOneLine(r, 1, /Cannot reach the Sandbar server at http:\/\/127\.0\.0\.1:9\/api \(ECONNREFUSED\): check that it is running/);
  });

  it("an expired sign-in without a refresh token", async () => {
    const cfg = join(dir, "expired");
    const { mkdir } = await import("node:fs/promises");
    await mkdir(cfg, { recursive: true });
    await writeFile(join(cfg, "config.json"), JSON.stringify({ version: 1, activeProfile: "default", profiles: { default: { apiUrl: `${t.url}/api`, jwtToken: "x.y.z", tokenExpiresAt: "2020-01-01T00:00:00Z", organizationId: "00000000-0000-4000-8000-000000000001" } } }), { mode: 0o600 });
    expectOneLine(await sandbar(["sandbox", "list"], { SANDBAR_CONFIG_DIR: cfg }), 1, /Your sign-in has expired: run `sandbar login`/);
  });

  it("a wrong key, and the stack trace only with --debug", async () => {
    const bad = { ...env, SANDBAR_API_KEY: "sbr_" + "0".repeat(64) };
    expectOneLine(await sandbar(["sandbox", "list"], bad), 1, /Not signed in, or your credentials expired or were revoked/);
    const debug = await sandbar(["sandbox", "list", "--debug"], bad);
    expect(debug.code).toBe(1);
    expect(debug.stderr).toMatch(/^sandbar: Not signed in/);
    expect(debug.stderr).toMatch(/\n\s+at /);
  });

  it("a missing sandbox, a bad option value, an unknown command: 1, 2, 2", async () => {
    expectOneLine(await sandbar(["sandbox", "get", "no-such-box"], env), 1, /Not found: Sandbox with ID or name no-such-box not found/);
    expectOneLine(await sandbar(["sandbox", "create", "--cpu", "two"], env), 2, /--cpu must be a positive whole number, got "two"/);
    expect((await sandbar(["sandboxx"], env)).code).toBe(2);
    expectOneLine(await sandbar(["cp", "a", "b"], env), 2, /One side must be a sandbox path/);
    expectOneLine(await sandbar(["shell", sandboxId], env), 2, /needs a terminal/);
  });

  it("429 from a server with a tiny limit names the wait from Retry-After", async () => {
    const limited = await startTestServer({ settings: { rateLimits: { store: "memory", windowSeconds: 60, limits: { anonymous: 100, authenticated: 2, "sandbox-create": 10, "sandbox-lifecycle": 10, "failed-auth": 100 } } } });
    try {
      const e = { SANDBAR_CONFIG_DIR: join(dir, "limited"), SANDBAR_API_URL: `${limited.url}/api`, SANDBAR_API_KEY: limited.adminKey };
      let last = await sandbar(["volume", "list"], e);
      for (let i = 0; i < 3 && last.code === 0; i++) last = await sandbar(["volume", "list"], e);
      expectOneLine(last, 1, /Rate limited by the server: .*Try again in \d+ s\./);
      const wait = Number(/in (\d+) s/.exec(last.stderr)![1]);
      expect(wait).toBeGreaterThan(0);
      expect(wait).toBeLessThanOrEqual(120);
    } finally {
      await limited.stop();
    }
  });
});

describe("help and completion", () => {
  it("--help everywhere, exit 0", async () => {
    for (const args of [["--help"], ["sandbox", "--help"], ["sandbox", "create", "--help"], ["exec", "--help"], ["org", "use", "--help"], ["snapshot", "create", "--help"]]) {
      const r = await sandbar(args, env);
      expect(r.code, args.join(" ")).toBe(0);
      expect(r.stdout).toMatch(/^Usage: sandbar /);
    }
  });

  it("bash completion completes commands, subcommands and options", async () => {
    const script = (await sandbar(["completion", "bash"], env)).stdout;
    const complete = (line: string) => {
      const words = line.split(" ");
      const program = `${script}\nCOMP_WORDS=(${words.map((w) => `'${w}'`).join(" ")}); COMP_CWORD=${words.length - 1}; _sandbar; printf '%s\\n' "\${COMPREPLY[@]}"`;
      return execFileSync("bash", ["--norc", "-c", program]).toString().trim().split("\n");
    };
    expect(complete("sandbar sa")).toEqual(["sandbox"]);
    expect(complete("sandbar sandbox ")).toEqual(expect.arrayContaining(["create", "list", "get", "start", "stop", "archive", "delete"]));
    expect(complete("sandbar sandbox create --sn")).toEqual(["--snapshot"]);
    expect(complete("sandbar --json org u")).toEqual(["use"]);
    const zsh = (await sandbar(["completion", "zsh"], env)).stdout;
    expect(zsh).toMatch(/^#compdef sandbar/);
    expectOneLine(await sandbar(["completion", "fish"], env), 2, /use bash or zsh/);
  });

  it("doctor still runs (serve is exercised by the crash suites)", async () => {
    const r = await sandbar(["doctor"], {});
    expect(r.stdout).toMatch(/bubblewrap/);
  });
});
