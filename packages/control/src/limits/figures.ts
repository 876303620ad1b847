import type { Counter } from "./settings.ts";

/** Where a call stands against its counter, for its response's headers. */
export interface Figures {
  counter: Counter;
  limit: number;
  remaining: number;
  /** Seconds until the window ends. */
  reset: number;
}

/** The spec's X-RateLimit-Limit/-Remaining/-Reset and the reference's per-counter spellings. */
export function writeFigures(f: Figures, set: (name: string, value: string) => void): void {
  const limit = String(f.limit);
  const remaining = String(f.remaining);
  const reset = String(f.reset);
  set("x-ratelimit-limit", limit);
  set("x-ratelimit-remaining", remaining);
  set("x-ratelimit-reset", reset);
  set(`x-ratelimit-limit-${f.counter}`, limit);
  set(`x-ratelimit-remaining-${f.counter}`, remaining);
  set(`x-ratelimit-reset-${f.counter}`, reset);
}
