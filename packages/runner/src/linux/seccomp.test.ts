import { execFileSync } from "node:child_process";
import { disposeFixture } from "../testing/dispose.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { blockedSyscalls } from "./syscall-filter.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";

// The seccomp filter in real sandboxes (host-/usr rootfs): every blocked system call, made
// directly with syscall(2) from Python's ctypes, fails with EPERM; everyday programs still work.

const asRoot = process.getuid?.() === 0;
let f: Fixture;
const id = uniqueId("seccomp");

/** x86-64 numbers of the blocked calls, resolved by libseccomp on the host. */
function syscallNumbers(names: string[]): Record<string, number> {
  const script = "import json,sys,seccomp\nout={}\nfor n in json.loads(sys.argv[1]):\n  try: out[n]=seccomp.resolve_syscall(seccomp.Arch.NATIVE, n)\n  except Exception: pass\nprint(json.dumps(out))";
  return JSON.parse(execFileSync("/usr/bin/python3", ["-c", script, JSON.stringify(names)]).toString()) as Record<string, number>;
}

beforeAll(async () => {
  if (!asRoot) return;
  f = await fixture();
  await f.provider.create(f.spec(id, { memoryGiB: 1 }));
  await f.provider.start(id);
});

afterAll(() => disposeFixture(f, [id]));

describe.skipIf(!asRoot)("seccomp", () => {
  it("refuses every blocked system call with EPERM", async () => {
    const numbers = syscallNumbers(blockedSyscalls());
    expect(Object.keys(numbers).length).toBeGreaterThan(30);
    // Arguments are all zero: what matters is that the kernel never runs the call. Without the
    // filter most of these fail differently (EFAULT, EINVAL, ENOSYS) or, for sync-like ones, succeed.
    const probe = [
      "import ctypes, json, sys",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "out = {}",
      "for name, nr in json.loads(sys.argv[1]).items():",
      "    ctypes.set_errno(0)",
      "    rc = libc.syscall(nr, 0, 0, 0, 0, 0, 0)",
      "    out[name] = ctypes.get_errno() if rc == -1 else 'ok'",
      "print(json.dumps(out))",
    ].join("\n");
    const res = await sh(f.provider, id, `/usr/bin/python3 -c '${probe}' '${JSON.stringify(numbers)}'`);
    expect(res.code, res.stderr).toBe(0);
    const results = JSON.parse(res.stdout) as Record<string, number | string>;
    const notRefused = Object.entries(results).filter(([, v]) => v !== 1);
    expect(notRefused).toEqual([]);
  });

  it("leaves ordinary programs alone: shell pipelines, git, python, pip, node (the agent), a compiler", async () => {
    const script = [
      "set -e",
      "cd $(mktemp -d)",
      "echo hello | tr a-z A-Z | grep -q HELLO",
      "git init -q repo && cd repo && git config user.email a@b && git config user.name a",
      "echo x > f && git add f && git commit -qm one && git log --oneline | grep -q one",
      "/usr/bin/python3 -c 'import subprocess, threading, os; print(os.getpid() > 0)'",
      "if [ -x /usr/bin/pip3 ]; then pip3 --version >/dev/null && pip3 list >/dev/null && echo pip-ok; else echo pip-ok; fi",
      "date >/dev/null && sleep 0.01",
      "printf 'int main(void){return 7;}' > t.c",
      "if command -v gcc >/dev/null; then gcc -o t t.c; rc=0; ./t || rc=$?; echo rc=$rc; else echo rc=127; fi",
    ].join("\n");
    const res = await sh(f.provider, id, script);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toContain("True");
    expect(res.stdout).toContain("pip-ok");
    expect(res.stdout).toMatch(/rc=(7|127)/);
    if (execFileSync("sh", ["-c", "command -v gcc || true"]).toString().trim()) expect(res.stdout).toContain("rc=7");
  });

  it("is what every process of the sandbox runs under, from its first", async () => {
    const res = await sh(f.provider, id, "grep -h Seccomp: /proc/1/status /proc/self/status");
    expect(res.stdout.trim().split("\n")).toEqual(["Seccomp:\t2", "Seccomp:\t2"]);
  });
});
