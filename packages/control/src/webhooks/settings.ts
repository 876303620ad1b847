// Operator settings of webhook delivery (docs/configuration.md, "Webhooks and audit"), read from the environment.

export interface WebhookSettings {
  /** Deliver to loopback, private and link-local addresses too (SANDBAR_WEBHOOK_ALLOW_PRIVATE). */
  allowPrivate: boolean;
  /** Wait before each retry; attempts = 1 + its length (SANDBAR_WEBHOOK_RETRY_SCHEDULE). */
  retryDelaysMs: number[];
  /** Bound on one attempt, connection to answer (SANDBAR_WEBHOOK_TIMEOUT_MS). */
  timeoutMs: number;
  /** Polling fallback beside the PostgreSQL notifications (SANDBAR_WEBHOOK_POLL_MS). */
  pollMs: number;
  /**
   * An endpoint is disabled when an event exhausts its attempts and no delivery to it has
   * succeeded for this long (SANDBAR_WEBHOOK_DISABLE_AFTER).
   */
  disableAfterMs: number;
  /** Attempts in flight per control process (SANDBAR_WEBHOOK_CONCURRENCY). */
  concurrency: number;
}

/** 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h: eight attempts over about a day and a half. */
const DEFAULT_RETRY_SCHEDULE = "5s,5m,30m,2h,5h,10h,14h";

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** "250ms", "5s", "30m", "2h", "1d" (a bare number is milliseconds). */
export function parseDuration(name: string, raw: string): number {
  const m = /^\s*(\d+)\s*(ms|s|m|h|d)?\s*$/.exec(raw);
  if (!m) throw new Error(`${name} must be durations like 250ms, 5s, 30m, 2h or 1d; got "${raw}"`);
  return Number(m[1]) * UNITS[m[2] ?? "ms"]!;
}

export function loadWebhookSettings(env: NodeJS.ProcessEnv): WebhookSettings {
  const allow = (env.SANDBAR_WEBHOOK_ALLOW_PRIVATE ?? "").toLowerCase();
  if (!["", "true", "false", "1", "0"].includes(allow)) throw new Error(`SANDBAR_WEBHOOK_ALLOW_PRIVATE must be true or false, got "${env.SANDBAR_WEBHOOK_ALLOW_PRIVATE}"`);
  const schedule = env.SANDBAR_WEBHOOK_RETRY_SCHEDULE ?? DEFAULT_RETRY_SCHEDULE;
  const duration = (name: string, fallback: string, min: number) => {
    const ms = parseDuration(name, env[name] || fallback);
    if (ms < min) throw new Error(`${name} must be at least ${min} ms, got "${env[name]}"`);
    return ms;
  };
  const concurrency = Number(env.SANDBAR_WEBHOOK_CONCURRENCY || 8);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) throw new Error(`SANDBAR_WEBHOOK_CONCURRENCY must be a whole number from 1 to 256, got "${env.SANDBAR_WEBHOOK_CONCURRENCY}"`);
  return {
    allowPrivate: allow === "true" || allow === "1",
    retryDelaysMs: schedule.trim() === "" ? [] : schedule.split(",").map((d) => parseDuration("SANDBAR_WEBHOOK_RETRY_SCHEDULE", d)),
    timeoutMs: duration("SANDBAR_WEBHOOK_TIMEOUT_MS", "15000", 100),
    pollMs: duration("SANDBAR_WEBHOOK_POLL_MS", "5000", 10),
    disableAfterMs: duration("SANDBAR_WEBHOOK_DISABLE_AFTER", "24h", 0),
    concurrency,
  };
}
