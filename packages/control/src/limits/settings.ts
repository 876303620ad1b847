/** The rate-limit counters, named as the reference's throttlers (header suffixes and storage keys). */
export type Counter = "anonymous" | "authenticated" | "sandbox-create" | "sandbox-lifecycle" | "failed-auth";

/** Requests (failed authentications for "failed-auth") per window and counter; 0 = unlimited. */
export type CounterLimits = Record<Counter, number>;

export interface RateLimitSettings {
  /**
   * Where counters live: "memory" for one control process, "postgres" (the project's database)
   * when several processes share a database and must share counters.
   */
  store: "memory" | "postgres";
  windowSeconds: number;
  limits: CounterLimits;
}

/** The spec's figures (section 8); failed authentications: as many as anonymous calls. */
export const DEFAULT_LIMITS: CounterLimits = {
  anonymous: 600,
  authenticated: 50_000,
  "sandbox-create": 600,
  "sandbox-lifecycle": 50_000,
  "failed-auth": 600,
};

const ENV: Record<Counter, string> = {
  anonymous: "SANDBAR_RATE_LIMIT_ANONYMOUS",
  authenticated: "SANDBAR_RATE_LIMIT_AUTHENTICATED",
  "sandbox-create": "SANDBAR_RATE_LIMIT_SANDBOX_CREATE",
  "sandbox-lifecycle": "SANDBAR_RATE_LIMIT_SANDBOX_LIFECYCLE",
  "failed-auth": "SANDBAR_RATE_LIMIT_FAILED_AUTH",
};

/**
 * SANDBAR_RATE_LIMIT_* from the environment. The store defaults to PostgreSQL with an external
 * database (other processes may share it) and to memory with the embedded one (one process).
 */
export function loadRateLimitSettings(env: NodeJS.ProcessEnv): RateLimitSettings {
  const store = env.SANDBAR_RATE_LIMIT_STORE || (env.DATABASE_URL ? "postgres" : "memory");
  if (store !== "memory" && store !== "postgres") throw new Error(`SANDBAR_RATE_LIMIT_STORE must be "memory" or "postgres", got "${store}"`);
  const limits = { ...DEFAULT_LIMITS };
  for (const [counter, name] of Object.entries(ENV) as Array<[Counter, string]>) {
    const raw = env[name];
    if (raw === undefined || raw === "") continue;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a whole number >= 0 (0: unlimited), got "${raw}"`);
    limits[counter] = n;
  }
  const rawWindow = env.SANDBAR_RATE_LIMIT_WINDOW_SECONDS;
  const windowSeconds = rawWindow === undefined || rawWindow === "" ? 60 : Number(rawWindow);
  if (!Number.isInteger(windowSeconds) || windowSeconds < 1) {
    throw new Error(`SANDBAR_RATE_LIMIT_WINDOW_SECONDS must be a whole number of seconds >= 1, got "${rawWindow}"`);
  }
  return { store, windowSeconds, limits };
}
