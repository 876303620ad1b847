import { constants } from "node:os";
import { lifetime } from "./run.ts";

// How `serve` and `runner` end: on SIGINT, SIGTERM or SIGHUP the service stops (its warm pool's
// sandboxes destroyed, its database stopped last) and the process exits once it has. A signal
// while it starts stops it as soon as it is up. The stop is bounded: past the deadline the process
// exits anyway (what it left is removed by the next start). A later signal forces the exit; one
// within a second of the first is the same request (`npm start` forwards the signal its process
// group got, so the server sees a Ctrl-C twice).

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
const STOP_DEADLINE_MS = 60_000;
const SAME_REQUEST_MS = 1_000;

export interface Stoppable {
  stop(): Promise<void>;
}

export interface StopTimes {
  /** Bound on the stop, from the first signal. */
  deadlineMs?: number;
  /** A repeat of the signal this soon after the first is not a second request. */
  sameRequestMs?: number;
}

/** Starts the service with the signal handlers already in place; resolves with it once started (rejects as `start` does). */
export async function serveUntilSignal<T extends Stoppable>(start: () => Promise<T>, log: (line: string) => void, what: string, times: StopTimes = {}): Promise<T> {
  const { deadlineMs = STOP_DEADLINE_MS, sameRequestMs = SAME_REQUEST_MS } = times;
  let service: T | undefined;
  let first: { signal: string; at: number } | undefined;
  let deadline: NodeJS.Timeout | undefined;
  let stopping = false;
  const stop = () => {
    if (stopping || !service) return;
    stopping = true;
    service.stop().then(
      () => {
        clearTimeout(deadline);
        process.exit(0);
      },
      (err: unknown) => {
        clearTimeout(deadline);
        log(`shutdown finished with errors: ${err instanceof Error ? err.message : String(err)}`);
        process.exit(1);
      },
    );
  };
  const onSignal = (signal: NodeJS.Signals) => {
    if (!first) {
      first = { signal, at: Date.now() };
      log(`${signal}: ${what}${service ? "" : " once started"}`);
      deadline = setTimeout(() => {
        log(`shutdown did not finish within ${deadlineMs / 1000} s: exiting; the next start removes what is left`);
        process.exit(1);
      }, deadlineMs);
      return stop();
    }
    if (Date.now() - first.at < sameRequestMs) return;
    log(`${signal} again: exiting before the shutdown finished; the next start removes what is left`);
    process.exit(128 + constants.signals[signal]);
  };
  for (const s of SIGNALS) process.on(s, onSignal);
  lifetime.keepAlive = true;
  try {
    service = await start();
  } catch (err) {
    for (const s of SIGNALS) process.removeListener(s, onSignal);
    clearTimeout(deadline);
    lifetime.keepAlive = false;
    throw err;
  }
  if (first) stop();
  return service;
}
