import { request } from "node:http";
import type { IncomingHttpHeaders } from "node:http";
import type { UntypedJson } from "../casts.ts";

export interface Answer {
  status: number;
  body: UntypedJson;
  headers: IncomingHttpHeaders;
}

/**
 * One REST call from a chosen loopback address (127.0.0.0/8 is all local), so each test has
 * callers of its own for the counters keyed by address.
 */
export function callFrom(
  from: string,
  base: string,
  verb: string,
  path: string,
  opts: { token?: string; headers?: Record<string, string>; body?: unknown } = {},
): Promise<Answer> {
  const url = new URL(`${base}/api${path}`);
  const text = opts.body === undefined ? undefined : JSON.stringify(opts.body);
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  if (text !== undefined) headers["content-type"] = "application/json";
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname + url.search, method: verb, headers, localAddress: from, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const raw = Buffer.concat(chunks).toString("utf8");
        let body: unknown = raw;
        try {
          body = raw ? JSON.parse(raw) : undefined;
        } catch {
          // not JSON: kept as text
        }
        resolve({ status: res.statusCode ?? 0, body, headers: res.headers });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(text);
  });
}

/** The figures of one counter on an answer: the spec's plain headers and the reference's per-counter ones. */
export function figures(a: Answer, counter: string) {
  const n = (name: string) => (a.headers[name] === undefined ? undefined : Number(a.headers[name]));
  return {
    limit: n("x-ratelimit-limit"),
    remaining: n("x-ratelimit-remaining"),
    reset: n("x-ratelimit-reset"),
    counterLimit: n(`x-ratelimit-limit-${counter}`),
    counterRemaining: n(`x-ratelimit-remaining-${counter}`),
    counterReset: n(`x-ratelimit-reset-${counter}`),
    retryAfter: n("retry-after"),
    counterRetryAfter: n(`retry-after-${counter}`),
  };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
