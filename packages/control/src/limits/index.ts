import { RateLimits } from "./rate-limits.ts";
import type { RateLimitSettings } from "./settings.ts";
import { memoryStore, postgresStore } from "./store.ts";

export { RateLimits } from "./rate-limits.ts";
export { type RateLimitSettings } from "./settings.ts";

/** The rate limits of one control process, counting in memory or in the shared database as the settings say. */
export function startRateLimits(settings: RateLimitSettings, databaseUrl: string, log: (line: string) => void): RateLimits {
  const shared = settings.store === "postgres";
  return new RateLimits(settings, shared ? postgresStore(databaseUrl) : memoryStore(), { shared, log });
}
