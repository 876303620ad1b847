import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { parseRemote } from "./commands/files.ts";
import { scriptOf, shellQuote } from "./commands/exec.ts";
import { explain, CliError } from "./failure.ts";
import { colorWanted, formatTable } from "./output.ts";
import { RateLimitedError, toSandbarError } from "./sdk.ts";

describe("cp paths", () => {
  it("SANDBOX:/path is remote; ./a:b, /a:b and plain names are local", () => {
    expect(parseRemote("box:/tmp/x")).toEqual({ sandbox: "box", path: "/tmp/x" });
    expect(parseRemote("0f1e-uuid:rel/x")).toEqual({ sandbox: "0f1e-uuid", path: "rel/x" });
    expect(parseRemote("box:")).toEqual({ sandbox: "box", path: "." });
    expect(parseRemote("./a:b")).toBeUndefined();
    expect(parseRemote("/abs/a:b")).toBeUndefined();
    expect(parseRemote("file.txt")).toBeUndefined();
  });
});

describe("exec scripts", () => {
  it("one word runs as a script; several are quoted words; --cwd and --env prefix it", () => {
    expect(scriptOf(["ls | wc -l"])).toBe("ls | wc -l");
    expect(scriptOf(["echo", "a b", "it's", "$HOME"])).toBe(`echo 'a b' 'it'\\''s' '$HOME'`);
    expect(scriptOf(["pwd"], { cwd: "/my dir", env: { A: "x y" } })).toBe(`cd '/my dir' && export A='x y'; pwd`);
    expect(() => scriptOf(["true"], { env: { "BAD-NAME": "1" } })).toThrow(CliError);
    expect(shellQuote("")).toBe("''");
  });
});

describe("one-line failures", () => {
  it("say what to do next for each kind of failure", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" });
    expect(explain(new ConnectError("fetch failed", Code.Unavailable, undefined, undefined, refused), "http://h/api")).toMatch(/^Cannot reach the Sandbar server at http:\/\/h\/api \(ECONNREFUSED\)/);
    expect(explain(toSandbarError(new ConnectError("Invalid credentials", Code.Unauthenticated)))).toMatch(/run `sandbar login`/);
    const limited = new RateLimitedError("Too Many Requests", { retryAfter: 42 });
    expect(explain(limited)).toBe("Rate limited by the server: Too Many Requests. Try again in 42 s.");
    const meta = new ConnectError("slow down", Code.ResourceExhausted, { "retry-after": "7" });
    expect(explain(meta)).toMatch(/Try again in 7 s\.$/);
    expect(explain(toSandbarError(new ConnectError("Sandbox x not found", Code.NotFound)))).toBe("Not found: Sandbox x not found.");
    expect(explain(new Error("boom"))).toBe("boom. Run again with --debug for details.");
    expect(explain(new Error("first\n  second\n"))).toBe("first second. Run again with --debug for details.");
  });
});

describe("output", () => {
  it("tables pad columns; colour needs a TTY and no NO_COLOR", () => {
    expect(formatTable([{ id: "a", name: "long name" }, { id: "bbb", name: "" }], ["id", "name"])).toBe("ID   NAME\na    long name\nbbb\n");
    const tty = { isTTY: true } as NodeJS.WriteStream;
    expect(colorWanted(tty, { TERM: "xterm" })).toBe(true);
    expect(colorWanted(tty, { TERM: "xterm", NO_COLOR: "1" })).toBe(false);
    expect(colorWanted({ isTTY: false } as NodeJS.WriteStream, {})).toBe(false);
  });
});
