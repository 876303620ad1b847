/**
 * The batching in front of a shared store. The store here is rate-limiter-flexible's memory
 * limiter shared by two BatchedCounters, standing for the PostgreSQL table two processes share
 * (the batching does not depend on the store; the PostgreSQL store itself is exercised by two
 * real control processes in limits.test.ts).
 */
import { RateLimiterMemory, RateLimiterRes } from "rate-limiter-flexible";
import { describe, expect, it, vi } from "vitest";
import { BatchedCounter, marginOf } from "./batched.ts";

const refused = (p: Promise<unknown>) =>
  p.then(
    () => false,
    (e: unknown) => {
      if (e instanceof RateLimiterRes) return true;
      throw e;
    },
  );

describe("batched counting against a shared store", () => {
  it("one process: exactly the limit goes through, the next call is refused, and the store holds every call", async () => {
    const limit = 250;
    const store = new RateLimiterMemory({ points: limit, duration: 60, blockDuration: 60 });
    const counter = new BatchedCounter();
    const remaining: number[] = [];
    for (let i = 0; i < limit; i++) remaining.push((await counter.consume(store, "k", limit)).remainingPoints);
    expect(remaining).toEqual(Array.from({ length: limit }, (_, i) => limit - 1 - i));
    expect(await refused(counter.consume(store, "k", limit))).toBe(true);
    expect((await store.get("k"))!.consumedPoints).toBeGreaterThan(limit);
    counter.close();
  });

  it("calls far from the limit reach the store in batches, none lost; near it each call goes to the store", async () => {
    // The batching takes its time from timers and Date.now(): faked, so that no flush or staleness
    // comes in the middle of the calls however slowly the machine runs them.
    vi.useFakeTimers();
    const limit = 10_000;
    const store = new RateLimiterMemory({ points: limit, duration: 60, blockDuration: 60 });
    const a = new BatchedCounter();
    const b = new BatchedCounter();
    try {
      for (let i = 0; i < 120; i++) {
        await a.consume(store, "k", limit);
        await b.consume(store, "k", limit);
      }
      // Only each one's first call went to the store at once; the rest arrive with the next flush.
      expect((await store.get("k"))!.consumedPoints).toBe(2);
      await vi.advanceTimersByTimeAsync(120);
      expect((await store.get("k"))!.consumedPoints).toBe(240);
      // Bring the key within the margin: from there, every call is in the store as it is made.
      await store.penalty("k", limit - marginOf(limit) - 240);
      await vi.advanceTimersByTimeAsync(120); // a's and b's counts are stale now: their next calls ask the store
      await a.consume(store, "k", limit);
      const before = (await store.get("k"))!.consumedPoints;
      await b.consume(store, "k", limit);
      await a.consume(store, "k", limit);
      expect((await store.get("k"))!.consumedPoints).toBe(before + 2);
    } finally {
      a.close();
      b.close();
      vi.useRealTimers();
    }
  });
});
