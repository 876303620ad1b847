import type { AgentEndpoint } from "../toolbox/agent-locator.ts";

/**
 * How long a found agent endpoint is trusted without asking the database and the runtime again.
 * Every write to a sandbox's row in this process evicts it at once (states change only through
 * the process whose runner holds the sandbox); the bound covers what no write announces, such
 * as an agent whose processes all died before the reconciler marked the sandbox.
 */
const ENDPOINT_TTL_MS = 2000;
const MAX_ENTRIES = 10_000;

interface Entry {
  endpoint: AgentEndpoint;
  at: number;
}

/**
 * The toolbox's sandbox lookups (organization + id or name → the agent's socket and secret),
 * kept between calls: a toolbox call otherwise pays a database query and two file reads.
 */
export class EndpointCache {
  readonly #entries = new Map<string, Entry>();
  /** Keys by sandbox id (a sandbox is found by its id and by its name). */
  readonly #keys = new Map<string, Set<string>>();
  #generation = 0;
  readonly #ttlMs: number;

  constructor(ttlMs = ENDPOINT_TTL_MS) {
    this.#ttlMs = ttlMs;
  }

  get(organizationId: string, idOrName: string, now = Date.now()): AgentEndpoint | undefined {
    const key = keyOf(organizationId, idOrName);
    const e = this.#entries.get(key);
    if (!e) return undefined;
    if (now - e.at <= this.#ttlMs) return e.endpoint;
    this.evict(e.endpoint.sandboxId);
    return undefined;
  }

  /** Marks the start of a lookup: `set` keeps its answer only when nothing was evicted since. */
  generation(): number {
    return this.#generation;
  }

  set(organizationId: string, idOrName: string, endpoint: AgentEndpoint, since: number, now = Date.now()): void {
    if (since !== this.#generation) return; // a write landed while the lookup ran: its answer may be stale
    if (this.#entries.size >= MAX_ENTRIES) this.clear();
    const key = keyOf(organizationId, idOrName);
    this.#entries.set(key, { endpoint, at: now });
    let keys = this.#keys.get(endpoint.sandboxId);
    if (!keys) this.#keys.set(endpoint.sandboxId, (keys = new Set()));
    keys.add(key);
  }

  /** Forgets every lookup that led to this sandbox. */
  evict(sandboxId: string): void {
    this.#generation++;
    for (const key of this.#keys.get(sandboxId) ?? []) this.#entries.delete(key);
    this.#keys.delete(sandboxId);
  }

  clear(): void {
    this.#generation++;
    this.#entries.clear();
    this.#keys.clear();
  }
}

const keyOf = (organizationId: string, idOrName: string) => `${organizationId}\u0000${idOrName}`;
