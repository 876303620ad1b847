import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { connectRefusal, guardedLookup } from "./destinations.ts";

// One HTTP POST of one webhook: bounded in time (the whole exchange) and in what is read back
// (a short prefix of the answer; the rest is never read), no redirects followed, the destination
// checked against the address actually connected to.

/** What is kept of a receiver's answer. */
const RESPONSE_PREFIX_BYTES = 1024;

export interface SendResult {
  statusCode?: number;
  /** The answer's first bytes, as text. */
  responseBody?: string;
  /** Why no acceptable answer came (connection, timeout, destination refused, non-2xx). */
  error?: string;
  durationMs: number;
}

export async function send(url: string, headers: Record<string, string>, body: string, opts: { timeoutMs: number; allowPrivate: boolean; signal?: AbortSignal }): Promise<SendResult> {
  const started = performance.now();
  const done = (r: Omit<SendResult, "durationMs">): SendResult => ({ ...r, durationMs: Math.round(performance.now() - started) });
  const target = new URL(url);
  const host = target.hostname.replace(/^\[(.*)\]$/, "$1");
  // A literal address skips name lookup, so it is checked here (the same check as the lookup's).
  const refused = isIP(host) ? connectRefusal(host, [host], opts.allowPrivate) : undefined;
  if (refused) return done({ error: refused });
  const timeout = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([timeout, opts.signal]) : timeout;
  try {
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const request = target.protocol === "https:" ? httpsRequest : httpRequest;
      const req = request(target, {
        method: "POST",
        headers: { ...headers, "content-length": String(Buffer.byteLength(body)) },
        lookup: guardedLookup(opts.allowPrivate),
        signal,
        agent: false,
      });
      req.once("response", resolve);
      req.on("error", reject); // kept: a late abort or reset after the answer must not go unhandled
      req.end(body);
    });
    const responseBody = await prefixOf(res, signal);
    const statusCode = res.statusCode ?? 0;
    const ok = statusCode >= 200 && statusCode < 300;
    return done({ statusCode, responseBody, ...(ok ? {} : { error: `HTTP ${statusCode}` }) });
  } catch (err) {
    const error = timeout.aborted ? `no answer within ${opts.timeoutMs} ms` : signal.aborted ? "delivery interrupted (server stopping)" : (err as Error).message || String(err);
    return done({ error });
  }
}

/** Reads at most RESPONSE_PREFIX_BYTES of the answer, then drops the connection. */
function prefixOf(res: IncomingMessage, signal: AbortSignal): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = () => {
      res.destroy();
      resolve(Buffer.concat(chunks).subarray(0, RESPONSE_PREFIX_BYTES).toString("utf8"));
    };
    res.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= RESPONSE_PREFIX_BYTES) finish();
    });
    res.once("end", finish);
    res.on("error", finish);
    signal.addEventListener("abort", finish, { once: true });
  });
}
