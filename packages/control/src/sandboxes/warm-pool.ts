import { randomUUID } from "node:crypto";
import { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import type { AgentClients } from "../toolbox/agent-clients.ts";
import type { AgentDial, SandboxRuntime } from "./runtime.ts";

/** What every pool sandbox is: a request asking for anything else is made the ordinary way. */
export interface PoolShape {
  snapshot: string;
  /** The snapshot's image (manifest digest in the host's store); absent for the default snapshot. */
  imageRef?: string;
  /** A running sandbox's snapshot: its captured layers, top first (on this host). */
  layers?: string[];
  cpu: number;
  memory: number;
  disk: number;
  user: string;
}

export interface PoolOptions {
  /**
   * Members wait paused (frozen, their reclaimable memory given back) and are thawed at claim: no
   * CPU while they wait, a few milliseconds more per claim (bench/sandboxes/run-pause.ts).
   */
  paused?: boolean;
  log?: (line: string) => void;
}

export interface PoolStats {
  size: number;
  ready: number;
  starting: number;
  claimed: number;
}

/**
 * A claim's refill waits this long: starting a sandbox takes a core for ~0.2 s, which would slow
 * the first calls into the sandbox just claimed (measured: exec 10-15 ms instead of 5-8 ms).
 */
const REFILL_DELAY_MS = 1_000;

/**
 * Commands a pool sandbox runs before it is offered. The first loads the agent's process code; the
 * next ones get the agent's (and control's) call path compiled past V8's lower tiers, which a
 * claimed sandbox's first execs would otherwise run in. Measured (bench/agent/warm-up.ts, the
 * agent's main-thread CPU per Execute "true", p50 of 6 agents): 3.0 ms at the 6th call, 2.2-2.3
 * from the 13th on; its private memory grows 2 MB meanwhile (which any sandbox used that much
 * grows anyway). So a claimed sandbox's first exec is the 13th call. --always-sparkplug instead
 * was no better by the 4th call and cost 6 ms more on the first and about 50 ms of start.
 */
const WARM_UP_CALLS = 12;

/** After a failed fill, wait this long (doubling up to the maximum) before trying again. */
const RETRY_MS = 2_000;
const RETRY_MAX_MS = 60_000;

/**
 * Sandboxes started ahead of requests, so a create that fits their shape answers at once. A
 * pool sandbox exists only on the host until claimed: no row, so it is in no list and counts
 * against no quota; a crash leaves it to reconciliation, which removes what has no row. Each is
 * warmed with one command (the agent loads its RPC stack and process code on first use) before
 * it is offered. The claiming request's identity lives in its row; its environment is given to
 * the agent and the host record at claim time, so nothing of one request reaches another.
 */
export class WarmPool {
  readonly shape: PoolShape;
  readonly #runtime: SandboxRuntime;
  #size: number;
  /** Why the last start failed; cleared by the next that succeeds. */
  #lastError: string | undefined;
  readonly #log: (line: string) => void;
  readonly #paused: boolean;
  readonly #clients: AgentClients;
  readonly #ready: string[] = [];
  /** The agent of each pool sandbox, dialled at its warm-up. */
  readonly #agents = new Map<string, AgentDial>();
  #starting = 0;
  #claimed = 0;
  #retryMs = RETRY_MS;
  #retryTimer: NodeJS.Timeout | undefined;
  #refillTimer: NodeJS.Timeout | undefined;
  /** Starts under way; each settles false when the pool closed meanwhile and its sandbox could not be removed. */
  #fills = new Set<Promise<boolean | void>>();
  #closed = false;

  /** `clients`: the toolbox's, so a claimed sandbox's first call reuses the connection its warm-up opened. */
  constructor(runtime: SandboxRuntime, size: number, shape: PoolShape, clients: AgentClients, o: PoolOptions = {}) {
    this.#runtime = runtime;
    this.#clients = clients;
    this.#size = size;
    this.shape = shape;
    this.#paused = o.paused ?? false;
    this.#log = o.log ?? (() => undefined);
  }

  /** Whether members wait paused. */
  get paused(): boolean {
    return this.#paused;
  }

  fits(r: PoolShape): boolean {
    const s = this.shape;
    return r.snapshot === s.snapshot && r.imageRef === s.imageRef && (r.layers ?? []).join() === (s.layers ?? []).join() && r.cpu === s.cpu && r.memory === s.memory && r.disk === s.disk && r.user === s.user;
  }

  /** A new size: a larger pool fills, a smaller one removes the ready sandboxes beyond it. */
  async resize(size: number): Promise<void> {
    this.#size = size;
    const extra = this.#ready.splice(size);
    for (const id of extra) this.#agents.delete(id);
    await Promise.all(extra.map((id) => this.#destroy(id)));
    this.fill();
  }

  /** Why the last start failed (undefined while starts succeed). */
  get lastError(): string | undefined {
    return this.#lastError;
  }

  /** A ready sandbox's id, now the caller's; undefined when none is ready. */
  claim(): string | undefined {
    const id = this.#ready.shift();
    if (id) this.#claimed++;
    clearTimeout(this.#refillTimer);
    this.#refillTimer = setTimeout(() => this.fill(), REFILL_DELAY_MS);
    this.#refillTimer.unref();
    return id;
  }

  /** The agent of a sandbox of this pool (claimed or not), as its warm-up dialled it. */
  agentOf(id: string): AgentDial | undefined {
    return this.#agents.get(id);
  }

  /** The claimed sandbox is its request's now (its row holds it): the pool forgets it. */
  release(id: string): void {
    this.#agents.delete(id);
  }

  /** A claimed sandbox whose request failed before anything ran in it (e.g. its name was taken). */
  giveBack(id: string): void {
    if (this.#closed) void this.#destroy(id);
    else this.#ready.unshift(id);
    this.#claimed--;
  }

  /** Makes the claimed sandbox its request's: thawed when members wait paused, then its environment. */
  async takeOver(id: string, env: Record<string, string>): Promise<void> {
    if (this.#paused) await this.#runtime.resume(id);
    await this.#applyEnv(id, env);
  }

  /** Gives the claimed sandbox its environment: the running agent now, the host record for later starts. */
  async #applyEnv(id: string, env: Record<string, string>): Promise<void> {
    if (Object.keys(env).length === 0) return;
    await this.#runtime.setEnv(id, env);
    const agent = await this.#runtime.connectAgent(id);
    await this.#clients.client(EnvironmentService, agent).setEnvironment({ env }, this.#auth(agent.secret));
  }

  stats(): PoolStats {
    return { size: this.#size, ready: this.#ready.length, starting: this.#starting, claimed: this.#claimed };
  }

  /** Starts sandboxes until the pool is full again (one at a time: a refill never competes with requests in bulk). */
  fill(): void {
    if (this.#closed || this.#retryTimer || this.#starting > 0 || this.#ready.length >= this.#size) return;
    this.#starting++;
    const run = this.#startOne()
      .then(
        (id) => {
          this.#retryMs = RETRY_MS;
          this.#lastError = undefined;
          // Closed or shrunk while it started: not wanted any more.
          if (this.#closed || this.#ready.length >= this.#size) return this.#destroy(id);
          this.#ready.push(id);
        },
        (err: unknown) => {
          this.#lastError = err instanceof Error ? err.message : String(err);
          this.#log(`warm pool ${this.shape.snapshot}: starting a sandbox failed (retry in ${this.#retryMs / 1000} s): ${this.#lastError}`);
          this.#retryTimer = setTimeout(() => {
            this.#retryTimer = undefined;
            this.fill();
          }, this.#retryMs);
          this.#retryTimer.unref();
          this.#retryMs = Math.min(RETRY_MAX_MS, this.#retryMs * 2);
        },
      )
      .finally(() => {
        this.#starting--;
        this.#fills.delete(run);
        this.fill();
      });
    this.#fills.add(run);
  }

  async #startOne(): Promise<string> {
    const id = randomUUID();
    const { cpu, memory, disk, user, imageRef, layers } = this.shape;
    try {
      await this.#runtime.create({ id, cpu, memoryGiB: memory, diskGiB: disk, env: {}, user, ...(imageRef ? { image: imageRef } : {}), ...(layers?.length ? { layers } : {}) });
      const agent = await this.#runtime.connectAgent(id);
      const process = this.#clients.client(ProcessService, agent);
      for (let i = 0; i < WARM_UP_CALLS; i++) await process.execute({ command: "true" }, this.#auth(agent.secret));
      if (this.#paused) await this.#runtime.pause(id);
      this.#agents.set(id, agent);
      return id;
    } catch (err) {
      await this.#destroy(id);
      throw err;
    }
  }

  #auth(secret: string) {
    return { headers: { authorization: `Bearer ${secret}` }, timeoutMs: 30_000 };
  }

  /**
   * Stops filling and removes the sandboxes nobody claimed (one being started is removed once it
   * is). Rejects, after trying every one, when one could not be removed: its mounts, loop device
   * and cgroup would stay on the host until the next start removes them.
   */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    clearTimeout(this.#refillTimer);
    const left = this.#ready.splice(0);
    this.#agents.clear();
    const results = await Promise.all([...left.map((id) => this.#destroy(id)), ...this.#fills]);
    const failed = results.filter((ok) => ok === false).length;
    if (failed > 0) throw new Error(`${failed} warm pool sandbox(es) could not be removed (see above)`);
  }

  /** Removes a pool sandbox; false (and the reason logged) when it could not be. */
  async #destroy(id: string): Promise<boolean> {
    try {
      await this.#runtime.destroy(id);
      return true;
    } catch (err) {
      this.#log(`warm pool: removing sandbox ${id} failed: ${err instanceof Error ? err.message : String(err)}`);
      return false;
    }
  }
}
