/**
 * One closed-loop load run with autocannon (HTTP/1.1 keep-alive, no pipelining). Latency
 * percentiles come from autocannon's per-response timings (sub-millisecond, from hrtime)
 * rather than its integer-millisecond histogram, and every response's status is counted.
 */
import { createRequire } from "node:module";
import { parseArgs } from "node:util";

/** The slice of autocannon's API used here (the package ships no types). */
interface AutocannonResult {
  duration: number;
  errors: number;
  timeouts: number;
  non2xx: number;
}
interface AutocannonInstance {
  on(event: "response", listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void): void;
  on(event: "reqError", listener: (err: Error) => void): void;
  stop(): void;
}
type Autocannon = (
  opts: {
    url: string; connections: number; duration: number; pipelining: number; timeout: number;
    method: string; headers: Record<string, string>; body?: string;
  },
  done: (err: Error | null, result: AutocannonResult) => void,
) => AutocannonInstance;

const autocannon = createRequire(import.meta.url)("autocannon") as Autocannon;

export interface LoadOptions {
  url: string;
  connections: number;
  durationSeconds: number;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
}

export interface LoadResult {
  /** Responses with a 2xx status. */
  ok: number;
  /** Responses with any other status, by status. */
  failedStatuses: Map<number, number>;
  /** Connection errors and timeouts. */
  errors: number;
  seconds: number;
  /** 2xx responses per second. */
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** First request-error message seen, to say why a run had errors. */
  firstError?: string;
}

export function runLoad(opts: LoadOptions): Promise<LoadResult> {
  return new Promise((resolve, reject) => {
    const latencies: number[] = [];
    const failedStatuses = new Map<number, number>();
    let firstError: string | undefined;
    const instance = autocannon(
      {
        url: opts.url, connections: opts.connections, duration: opts.durationSeconds, pipelining: 1, timeout: 10,
        method: opts.method ?? "GET", headers: opts.headers ?? {}, body: opts.body,
      },
      (err, result) => {
        if (err) return reject(err);
        const sorted = Float64Array.from(latencies).sort();
        const ok = sorted.length;
        resolve({
          ok,
          failedStatuses,
          errors: result.errors,
          seconds: result.duration,
          rps: result.duration > 0 ? ok / result.duration : 0,
          p50Ms: percentile(sorted, 0.5),
          p99Ms: percentile(sorted, 0.99),
          firstError,
        });
      },
    );
    instance.on("response", (_client, status, _bytes, ms) => {
      if (status >= 200 && status < 300) latencies.push(ms);
      else failedStatuses.set(status, (failedStatuses.get(status) ?? 0) + 1);
    });
    instance.on("reqError", (err) => {
      firstError ??= err.message;
    });
  });
}

/** Nearest-rank percentile of an ascending array (NaN when empty). */
function percentile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

/** A command-line option that must be a whole number >= 1 (both control benches take a few). */
export function positiveOption(name: string, text: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive whole number, got "${text}"`);
  return n;
}

/** The load benches' common flags (--duration, --connections, --warmup, --rounds), each a positive whole number. */
export function loadOptions(defaults: { duration: number; connections: number; warmup: number; rounds: number }): BenchOptions {
  const { values } = parseArgs({
    options: {
      duration: { type: "string", default: String(defaults.duration) },
      connections: { type: "string", default: String(defaults.connections) },
      warmup: { type: "string", default: String(defaults.warmup) },
      rounds: { type: "string", default: String(defaults.rounds) },
    },
    strict: true,
  });
  return {
    durationSeconds: positiveOption("duration", values.duration),
    connections: positiveOption("connections", values.connections),
    warmupSeconds: positiveOption("warmup", values.warmup),
    rounds: positiveOption("rounds", values.rounds),
  };
}

/** What loadOptions answers. */
export interface BenchOptions {
  durationSeconds: number;
  connections: number;
  warmupSeconds: number;
  rounds: number;
}
