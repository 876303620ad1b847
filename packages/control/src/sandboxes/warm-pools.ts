import type { AgentClients } from "../toolbox/agent-clients.ts";
import type { SandboxRuntime } from "./runtime.ts";
import { type PoolShape, WarmPool } from "./warm-pool.ts";

// Every warm pool of this server: the operator's default pool (SANDBAR_WARM_POOL sandboxes of
// the default snapshot's default shape, any organization may claim one) and the organizations'
// own pools (warm_pool rows, the WarmPoolService), each claimed only by its organization's
// creates in its region. Pools run on this server's own runtime.

/** Key of the operator's pool (organizations' pools are keyed by their row id). */
const DEFAULT_POOL = "default";

interface Entry {
  pool: WarmPool;
  /** Whose creates may claim; undefined: anyone's (the operator's pool). */
  organizationId?: string;
  regionId?: string;
}

/** A claimed pool sandbox: its id, and the pool it came from (undefined: the operator's). */
export interface Claim {
  id: string;
  pool: WarmPool;
  poolId?: string;
}

export class WarmPools {
  readonly #runtime: SandboxRuntime;
  readonly #clients: AgentClients;
  readonly #log: (line: string) => void;
  readonly #entries = new Map<string, Entry>();

  constructor(runtime: SandboxRuntime, clients: AgentClients, log: (line: string) => void) {
    this.#runtime = runtime;
    this.#clients = clients;
    this.#log = log;
  }

  /** The operator's pool, when one is configured. */
  get default(): WarmPool | undefined {
    return this.#entries.get(DEFAULT_POOL)?.pool;
  }

  /** Keeps `size` sandboxes of `shape` for any organization. */
  setDefault(size: number, shape: PoolShape): void {
    this.#entries.set(DEFAULT_POOL, { pool: new WarmPool(this.#runtime, size, shape, this.#clients, { log: this.#log }) });
  }

  /** An organization's pool, made (not filled yet) or resized. */
  async set(id: string, organizationId: string, regionId: string, size: number, shape: PoolShape, paused = false): Promise<WarmPool> {
    const known = this.#entries.get(id);
    if (known) {
      await known.pool.resize(size);
      return known.pool;
    }
    const pool = new WarmPool(this.#runtime, size, shape, this.#clients, { paused, log: this.#log });
    this.#entries.set(id, { pool, organizationId, regionId });
    return pool;
  }

  get(id: string): WarmPool | undefined {
    return this.#entries.get(id)?.pool;
  }

  /** Removes the pool and its unclaimed sandboxes. */
  async remove(id: string): Promise<void> {
    const entry = this.#entries.get(id);
    this.#entries.delete(id);
    await entry?.pool.close();
  }

  /**
   * A ready sandbox for this create, from its organization's pool of its snapshot, shape and region
   * first, else from the operator's; undefined when none fits or none is ready.
   */
  claim(input: { organizationId: string; regionId: string } & PoolShape): Claim | undefined {
    let fallback: Claim | undefined;
    for (const [key, e] of this.#entries) {
      if (e.organizationId !== undefined && (e.organizationId !== input.organizationId || e.regionId !== input.regionId)) continue;
      if (!e.pool.fits(input)) continue;
      if (e.organizationId === undefined) {
        fallback ??= { id: "", pool: e.pool };
        continue;
      }
      const id = e.pool.claim();
      if (id) return { id, pool: e.pool, poolId: key };
    }
    const id = fallback?.pool.claim();
    return id && fallback ? { id, pool: fallback.pool } : undefined;
  }

  /** Fills every pool (after reconciliation has removed an earlier run's pool sandboxes). */
  fill(): void {
    for (const e of this.#entries.values()) e.pool.fill();
  }

  /** Closes every pool; rejects once all were tried when one left sandboxes behind. */
  async close(): Promise<void> {
    const results = await Promise.allSettled([...this.#entries.values()].map((e) => e.pool.close()));
    this.#entries.clear();
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
  }
}
