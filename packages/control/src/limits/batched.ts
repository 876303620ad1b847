import type { RateLimiterAbstract } from "rate-limiter-flexible";

/** How often calls counted locally are added to the shared store. */
const FLUSH_MS = 50;
/** A count older than this is asked again before calls are counted locally on it (an idle process knows nothing of others' calls). */
const STALE_MS = 2 * FLUSH_MS;
/** Bound on the leases kept per limiter (one per key seen). */
const MAX_LEASES = 100_000;

/** Calls a process may count locally only while the key has at least this many left. */
export const marginOf = (limit: number) => Math.max(100, Math.ceil(limit / 10));

interface Lease {
  limiter: RateLimiterAbstract;
  key: string;
  /** The key's count as the store last answered it. */
  known: number;
  /** Calls counted here since, not yet in the store. */
  pending: number;
  /** When the key's window ends (ms since the epoch). */
  expiresAt: number;
  /** When `known` was answered. */
  syncedAt: number;
}

export interface Counted {
  consumedPoints: number;
  remainingPoints: number;
  msBeforeNext: number;
}

/**
 * Counting against a store shared by several processes without a round trip per call: while a
 * key is far from its limit (more than marginOf(limit) left), calls are counted in memory and
 * added to the store every FLUSH_MS, each addition answering the key's count across processes;
 * near the limit, or when that count is older than STALE_MS, every call goes to the store, so
 * the call past the limit is refused exactly by a process's own count and to within one flush
 * of the others' (their last FLUSH_MS of calls is seen late, never lost; the Remaining figure
 * is approximate while far from the limit). Failures of the store propagate to the caller
 * (which lets calls through).
 */
export class BatchedCounter {
  private readonly leases = new Map<RateLimiterAbstract, Map<string, Lease>>();
  /** Leases with calls not yet in the store. */
  private dirty: Lease[] = [];
  private timer: NodeJS.Timeout | undefined;

  async consume(limiter: RateLimiterAbstract, key: string, limit: number): Promise<Counted> {
    let leases = this.leases.get(limiter);
    if (!leases) this.leases.set(limiter, (leases = new Map()));
    const now = Date.now();
    const lease = leases.get(key);
    if (lease && lease.expiresAt > now && now - lease.syncedAt < STALE_MS && limit - lease.known - lease.pending > marginOf(limit)) {
      if (lease.pending++ === 0) this.dirty.push(lease);
      this.timer ??= setTimeout(() => this.flush(), FLUSH_MS).unref();
      const consumed = lease.known + lease.pending;
      return { consumedPoints: consumed, remainingPoints: limit - consumed, msBeforeNext: lease.expiresAt - now };
    }
    // Near the limit (or on a key's first call): this call, with what was counted here since, in
    // the store; it throws the limiter's RateLimiterRes past the limit.
    const pending = lease && lease.expiresAt > now ? lease.pending : 0;
    if (lease) lease.pending = 0;
    const res = await limiter.consume(key, 1 + pending);
    let current = leases.get(key);
    if (!current) {
      // Idle keys are forgotten wholesale when too many pile up (a lease is only a cache of the store).
      if (leases.size >= MAX_LEASES) leases.clear();
      leases.set(key, (current = { limiter, key, known: 0, pending: 0, expiresAt: 0, syncedAt: 0 }));
    }
    current.known = res.consumedPoints;
    current.syncedAt = Date.now();
    current.expiresAt = current.syncedAt + res.msBeforeNext;
    return { consumedPoints: res.consumedPoints + current.pending, remainingPoints: Math.max(0, res.remainingPoints - current.pending), msBeforeNext: res.msBeforeNext };
  }

  /** Adds what was counted here to the store; calls whose window has ended are dropped with it. */
  private flush(): void {
    this.timer = undefined;
    const now = Date.now();
    const dirty = this.dirty;
    this.dirty = [];
    for (const lease of dirty) {
      const n = lease.pending;
      lease.pending = 0;
      if (n === 0 || lease.expiresAt <= now) continue;
      lease.limiter.penalty(lease.key, n).then(
        (res) => {
          lease.known = res.consumedPoints;
          lease.syncedAt = Date.now();
          lease.expiresAt = lease.syncedAt + res.msBeforeNext;
        },
        // The store is failing: those calls went through uncounted, as calls do while it fails.
        () => {},
      );
    }
  }

  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
