import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, expect, it } from "vitest";

// How `serve` ends on signals (stop-on-signal.ts), on a real process and real signals, with a
// stand-in service whose start and stop the test finishes (testing/signal-service.ts).

const SERVICE = fileURLToPath(new URL("./testing/signal-service.ts", import.meta.url));
const children: ChildProcess[] = [];

afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});

function service(times: { deadlineMs: number; sameRequestMs: number }) {
  const child = spawn(process.execPath, [SERVICE], { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, DEADLINE_MS: String(times.deadlineMs), SAME_REQUEST_MS: String(times.sameRequestMs) } });
  children.push(child);
  let out = "";
  const seen = new Map<string, () => void>();
  child.stdout!.on("data", (c: Buffer) => {
    out += c.toString();
    for (const [text, resolve] of seen) if (out.includes(text)) resolve();
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return {
    child,
    output: () => out,
    exited,
    /** Resolves once the output holds `text` (the test's timeout bounds it). */
    said: (text: string) => (out.includes(text) ? Promise.resolve() : new Promise<void>((resolve) => seen.set(text, resolve))),
    tell: (word: string) => child.stdin!.write(word + "\n"),
  };
}

const LONG = 60_000;

it("the first signal stops the service and exits 0 once it has; a repeat right after it is the same request", async () => {
  const s = service({ deadlineMs: LONG, sameRequestMs: LONG });
  s.tell("started");
  await s.said("serving");
  s.child.kill("SIGINT");
  s.child.kill("SIGINT"); // npm start forwards the Ctrl-C its process group got
  await s.said("stop called");
  s.tell("stopped");
  expect(await s.exited).toBe(0);
  expect(s.output()).toBe("start called\nserving\nSIGINT: stopping\nstop called\n");
});

it("a later signal exits at once, before the stop finished", async () => {
  const s = service({ deadlineMs: LONG, sameRequestMs: 0 });
  s.tell("started");
  await s.said("serving");
  s.child.kill("SIGTERM");
  await s.said("stop called");
  s.child.kill("SIGINT");
  expect(await s.exited).toBe(130);
  expect(s.output()).toContain("SIGINT again: exiting before the shutdown finished");
});

it("a stop past the deadline exits 1", async () => {
  const s = service({ deadlineMs: 200, sameRequestMs: LONG });
  s.tell("started");
  await s.said("serving");
  s.child.kill("SIGHUP");
  expect(await s.exited).toBe(1);
  expect(s.output()).toContain("SIGHUP: stopping\nstop called\nshutdown did not finish within 0.2 s");
});

it("a signal while it starts stops it once started", async () => {
  const s = service({ deadlineMs: LONG, sameRequestMs: LONG });
  await s.said("start called");
  s.child.kill("SIGTERM");
  await s.said("SIGTERM: stopping once started");
  s.tell("started");
  await s.said("stop called");
  s.tell("stopped");
  expect(await s.exited).toBe(0);
});
