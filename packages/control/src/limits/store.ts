import pg from "pg";
import { RateLimiterMemory, RateLimiterPostgres, type RateLimiterAbstract } from "rate-limiter-flexible";
import type { Counter } from "./settings.ts";

/** The table made by migration 0007 (key, points, expire), as rate-limiter-flexible's PostgreSQL store expects it. */
const TABLE = "rate_limit";

/**
 * Where counters live: rate-limiter-flexible limiters, one per counter, limit and window (an
 * organization's override is its own limiter over the same keys). Each is a fixed window that,
 * once exceeded, blocks the key for one more window, as the reference's throttlers.
 */
export interface LimiterStore {
  limiter(counter: Counter, points: number, seconds: number): RateLimiterAbstract;
  close(): Promise<void>;
}

export function memoryStore(): LimiterStore {
  return cached((counter, points, duration) => new RateLimiterMemory({ keyPrefix: counter, points, duration, blockDuration: duration }), async () => {});
}

/** Counters in the project's PostgreSQL, so every control process of one database counts together. */
export function postgresStore(databaseUrl: string): LimiterStore {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  // An idle connection dropped by the server is replaced on next use; a failing query fails open (see RateLimits).
  pool.on("error", () => {});
  let sweeper = true;
  const store = cached(
    (counter, points, duration) => {
      // One limiter deletes rows expired an hour ago every five minutes; the others need not.
      const clearExpiredByTimeout = sweeper;
      sweeper = false;
      return new RateLimiterPostgres({
        storeClient: pool,
        storeType: "pool",
        tableName: TABLE,
        tableCreated: true,
        clearExpiredByTimeout,
        keyPrefix: counter,
        points,
        duration,
        blockDuration: duration,
      });
    },
    () => pool.end(),
  );
  return store;
}

function cached(make: (counter: Counter, points: number, seconds: number) => RateLimiterAbstract, close: () => Promise<void>): LimiterStore {
  const limiters = new Map<string, RateLimiterAbstract>();
  return {
    limiter(counter, points, seconds) {
      const id = `${counter}/${points}/${seconds}`;
      let l = limiters.get(id);
      if (!l) limiters.set(id, (l = make(counter, points, seconds)));
      return l;
    },
    close,
  };
}
