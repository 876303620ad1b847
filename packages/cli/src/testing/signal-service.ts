import { createInterface } from "node:readline";
import { serveUntilSignal } from "../stop-on-signal.ts";

// A process serving a stand-in service under serveUntilSignal, for stop-on-signal.test.ts: its
// start and its stop finish when the test writes "started" and "stopped" on its stdin, and it
// prints what happens ("start called", "stop called", the log lines).

const told = new Set<string>();
const waiters = new Map<string, () => void>();
createInterface({ input: process.stdin }).on("line", (l) => {
  told.add(l.trim());
  waiters.get(l.trim())?.();
});
const until = (word: string) => new Promise<void>((resolve) => (told.has(word) ? resolve() : waiters.set(word, resolve)));
const log = (line: string) => console.log(line);

await serveUntilSignal(
  async () => {
    log("start called");
    await until("started");
    return {
      async stop() {
        log("stop called");
        await until("stopped");
      },
    };
  },
  log,
  "stopping",
  { deadlineMs: Number(process.env.DEADLINE_MS), sameRequestMs: Number(process.env.SAME_REQUEST_MS) },
);
log("serving");
