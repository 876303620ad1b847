import { createHash } from "node:crypto";
import { Auth, Code, ConnectError, RateLimit, type Route } from "@sandbar/protocol";
import { RateLimiterRes } from "rate-limiter-flexible";
import { BatchedCounter, type Counted } from "./batched.ts";
import type { Figures } from "./figures.ts";
import type { Counter, RateLimitSettings } from "./settings.ts";
import type { LimiterStore } from "./store.ts";

/** The reference's 429 message (its throttler's text; the docs' "Rate limit exceeded" is not what it sends). */
const TOO_MANY_REQUESTS = "ThrottlerException: Too Many Requests";

/** The metadata of an error that the REST gateway writes as response headers (others stay internal). */
export const RATE_LIMIT_HEADER = /^(x-ratelimit-|retry-after)/i;

/** The counters an organization may have its own limit and window for (null: the server's). */
type OverridableCounter = "authenticated" | "sandbox-create" | "sandbox-lifecycle";
export type RateLimitOverrides = Partial<Record<OverridableCounter, { limit: number | null; seconds: number | null }>>;

/** Who a call counts for: its organization, else its user, else its address. */
export interface Caller {
  address: string;
  organizationId?: string;
  userId?: string;
  overrides?: RateLimitOverrides;
}

/** How long a PostgreSQL-backed process trusts "this address is not blocked" before asking again. */
const SHARED_BLOCK_RECHECK_MS = 1000;
/** Bound on the per-process caches of blocks and checks (addresses and organizations are open-ended). */
const MAX_CACHED = 100_000;

/**
 * The four counters of the spec (section 8) and the reference's failed-authentication limiter,
 * over one store. Blocks are also kept in memory, so a blocked caller is refused without a trip
 * to the store; with a shared store, calls far from their limit are counted in batches (see
 * BatchedCounter). A store failure lets calls through (as the reference): limits protect the
 * service, they are not worth refusing it.
 */
export class RateLimits {
  private readonly settings: RateLimitSettings;
  private readonly store: LimiterStore;
  private readonly shared: boolean;
  /** With a shared store: calls far from their limit are counted in memory and added in batches. */
  private readonly batched?: BatchedCounter;
  private readonly log: (line: string) => void;
  /** Blocked keys, until when (ms since the epoch). */
  private readonly blocks = new Map<string, number>();
  /** Addresses whose failed-auth block was looked up in the shared store, and when. */
  private readonly checked = new Map<string, number>();
  private lastFailureLog = 0;

  constructor(settings: RateLimitSettings, store: LimiterStore, opts: { shared: boolean; log: (line: string) => void }) {
    this.settings = settings;
    this.store = store;
    this.shared = opts.shared;
    if (opts.shared) this.batched = new BatchedCounter();
    this.log = opts.log;
  }

  /** The counter a method's calls count against, if any (declared once per RPC in the contract). */
  counterOf(route: Route): Exclude<Counter, "failed-auth"> | undefined {
    switch (route.rateLimit) {
      case RateLimit.NONE:
        return undefined;
      case RateLimit.SANDBOX_CREATE:
        return "sandbox-create";
      case RateLimit.SANDBOX_LIFECYCLE:
        return "sandbox-lifecycle";
      default:
        return route.auth === Auth.PUBLIC ? "anonymous" : "authenticated";
    }
  }

  /**
   * Counts one call of `route` and answers its figures (undefined when not limited); past the
   * limit it throws RESOURCE_EXHAUSTED (429) carrying Retry-After and the figures.
   */
  async count(route: Route, caller: Caller): Promise<Figures | undefined> {
    const counter = this.counterOf(route);
    if (!counter) return undefined;
    const override = counter === "anonymous" ? undefined : caller.overrides?.[counter];
    const limit = override?.limit ?? this.settings.limits[counter];
    const seconds = override?.seconds || this.settings.windowSeconds;
    if (limit === 0) return undefined;
    const tracker = storable(
      counter === "anonymous"
        ? `anonymous:${caller.address}`
        : caller.organizationId
          ? `auth:org:${caller.organizationId}`
          : caller.userId
            ? `auth:user:${caller.userId}`
            : `fallback:${caller.address}`,
    );
    const blockKey = `${counter}:${tracker}`;
    const blockedFor = this.blockedFor(blockKey);
    if (blockedFor > 0) throw tooManyRequests(counter, limit, blockedFor);
    let res: Counted;
    try {
      const limiter = this.store.limiter(counter, limit, seconds);
      res = this.batched ? await this.batched.consume(limiter, tracker, limit) : await limiter.consume(tracker);
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) return void this.failOpen(err);
      this.block(blockKey, err.msBeforeNext);
      throw tooManyRequests(counter, limit, err.msBeforeNext);
    }
    return { counter, limit, remaining: res.remainingPoints, reset: secondsOf(res.msBeforeNext) };
  }

  /**
   * Refuses a request from an address blocked for failed authentications, before its credentials
   * are read. Answers a promise only when it must ask the shared store (the hot path stays synchronous).
   */
  refuseBlocked(address: string): Promise<void> | undefined {
    const limit = this.settings.limits["failed-auth"];
    if (limit === 0) return undefined;
    const key = `failed-auth:${address}`;
    const blockedFor = this.blockedFor(key);
    if (blockedFor > 0) throw tooManyRequests("failed-auth", limit, blockedFor);
    if (!this.shared) return undefined;
    // Another process may have blocked the address: ask the store, at most once a second per address.
    const now = Date.now();
    const seen = this.checked.get(address);
    if (seen !== undefined && now - seen < SHARED_BLOCK_RECHECK_MS) return undefined;
    if (this.checked.size >= MAX_CACHED) this.checked.clear();
    this.checked.set(address, now);
    return this.store
      .limiter("failed-auth", limit, this.settings.windowSeconds)
      .get(address)
      .then(
        (res) => {
          if (!res || res.consumedPoints < limit) return;
          this.block(key, res.msBeforeNext);
          throw tooManyRequests("failed-auth", limit, res.msBeforeNext);
        },
        (err: unknown) => this.failOpen(err),
      );
  }

  /**
   * Counts a failed authentication (a 401) from `address`: answers the 401 with the failed-auth
   * figures, or, at the limit-th failure of the window, a 429 that blocks the address for a
   * window (the reference blocks on the limit-th failure, where its other counters block past
   * the limit). A later success does not reset the count.
   */
  async failedAuthentication(address: string, unauthenticated: ConnectError): Promise<ConnectError> {
    const limit = this.settings.limits["failed-auth"];
    if (limit === 0) return unauthenticated;
    const seconds = this.settings.windowSeconds;
    const limiter = this.store.limiter("failed-auth", limit, seconds);
    const key = `failed-auth:${address}`;
    let res: RateLimiterRes;
    try {
      res = await limiter.consume(address);
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) {
        this.failOpen(err);
        return unauthenticated;
      }
      this.block(key, err.msBeforeNext);
      return tooManyRequests("failed-auth", limit, err.msBeforeNext);
    }
    if (res.consumedPoints >= limit) {
      await limiter.block(address, seconds).catch((err: unknown) => this.failOpen(err));
      this.block(key, seconds * 1000);
      return tooManyRequests("failed-auth", limit, seconds * 1000);
    }
    unauthenticated.metadata.set("x-ratelimit-limit-failed-auth", String(limit));
    unauthenticated.metadata.set("x-ratelimit-remaining-failed-auth", String(limit - res.consumedPoints));
    unauthenticated.metadata.set("x-ratelimit-reset-failed-auth", String(secondsOf(res.msBeforeNext)));
    return unauthenticated;
  }

  /** The server's limits as GET /config shows them (counters without a limit are left out, as the reference). */
  advertised(): Record<"authenticated" | "sandboxCreate" | "sandboxLifecycle", { ttl?: number; limit?: number }> {
    const entry = (counter: Counter) => {
      const limit = this.settings.limits[counter];
      return limit === 0 ? {} : { ttl: this.settings.windowSeconds, limit };
    };
    return { authenticated: entry("authenticated"), sandboxCreate: entry("sandbox-create"), sandboxLifecycle: entry("sandbox-lifecycle") };
  }

  close(): Promise<void> {
    this.batched?.close();
    return this.store.close();
  }

  private blockedFor(key: string): number {
    const until = this.blocks.get(key);
    if (until === undefined) return 0;
    const left = until - Date.now();
    if (left <= 0) this.blocks.delete(key);
    return left;
  }

  private block(key: string, ms: number): void {
    if (ms <= 0) return;
    if (this.blocks.size >= MAX_CACHED) this.blocks.clear();
    this.blocks.set(key, Date.now() + ms);
  }

  private failOpen(err: unknown): void {
    const now = Date.now();
    if (now - this.lastFailureLog < 60_000) return;
    this.lastFailureLog = now;
    this.log(`rate limits: the counter store failed, calls pass unlimited: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** Keys fit the store's column (255): a long one (user ids may be 255 characters) is stored by its digest. */
const storable = (key: string) => (key.length <= 200 ? key : `sha256:${createHash("sha256").update(key).digest("hex")}`);

const secondsOf = (ms: number) => Math.max(0, Math.ceil(ms / 1000));

/** 429 / RESOURCE_EXHAUSTED with the spec's headers and the reference's per-counter Retry-After (plain for failed-auth, as it does). */
function tooManyRequests(counter: Counter, limit: number, msLeft: number): ConnectError {
  const wait = String(Math.max(1, secondsOf(msLeft)));
  const h = new Headers({ "retry-after": wait, "x-ratelimit-limit": String(limit), "x-ratelimit-remaining": "0", "x-ratelimit-reset": wait });
  if (counter === "failed-auth") {
    h.set("x-ratelimit-limit-failed-auth", String(limit));
    h.set("x-ratelimit-remaining-failed-auth", "0");
    h.set("x-ratelimit-reset-failed-auth", wait);
  } else {
    h.set(`retry-after-${counter}`, wait);
  }
  return new ConnectError(TOO_MANY_REQUESTS, Code.ResourceExhausted, h);
}
