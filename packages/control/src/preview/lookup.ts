import { errors } from "@sandbar/protocol";
import type { TunnelDial } from "./upstreams.ts";
import type { SandboxManager } from "../sandboxes/manager.ts";
import { reportedState } from "../sandboxes/states.ts";
import type { SignedPreviewUrls } from "./signed-urls.ts";
import type { PortEndpoint } from "./upstreams.ts";

/** What the proxy needs to know about a sandbox. */
export interface PreviewSandbox {
  id: string;
  organizationId: string;
  public: boolean;
  authToken: string;
  state: string;
  desiredState: string;
}

/** How long the proxy trusts what it read (the reference caches its checks for seconds to minutes). */
export const LOOKUP_TTL_MS = 1000;
const MAX_ENTRIES = 10_000;

type Entry<T> = { value: T; until: number };

/**
 * The proxy's reads of sandboxes, signed tokens and agent endpoints, each kept for a second so
 * a busy port costs no database round trip per request. A token rotated by a restart or a
 * changed public flag takes effect within that second; `forget` drops a sandbox at once.
 */
export class PreviewLookup {
  readonly #manager: SandboxManager;
  readonly #signed: SignedPreviewUrls;
  readonly #ttlMs: number;
  readonly #sandboxes = new Map<string, Entry<PreviewSandbox | undefined>>();
  readonly #tokens = new Map<string, Entry<{ sandboxId: string; expiresAt: number } | undefined>>();
  readonly #endpoints = new Map<string, Entry<TunnelDial>>();

  constructor(manager: SandboxManager, signed: SignedPreviewUrls, ttlMs = LOOKUP_TTL_MS) {
    this.#manager = manager;
    this.#signed = signed;
    this.#ttlMs = ttlMs;
    // A write to a sandbox's row (a pause above all: its agent stops answering) drops what was
    // read of it at once, as the toolbox's endpoint cache does.
    const earlier = manager.store.onWrite;
    manager.store.onWrite = (id) => {
      earlier(id);
      this.forget(id);
    };
  }

  /** The sandbox, or 404 for an unknown or destroyed one. */
  async sandbox(id: string): Promise<PreviewSandbox> {
    const row = await this.#cached(this.#sandboxes, id, async () => {
      const r = await this.#manager.store.byId(id);
      if (!r || r.state === "destroyed") return undefined;
      return { id: r.id, organizationId: r.organizationId, public: r.public, authToken: r.authToken, state: r.state, desiredState: r.desiredState };
    });
    if (!row) throw errors.notFound(`Sandbox with ID ${id} not found`);
    return row;
  }

  /** The sandbox a signed URL's token opens `port` of; 403 for an unknown, expired or other port's token. */
  async signedSandbox(token: string, port: number): Promise<string> {
    const hit = await this.#cached(this.#tokens, `${token}:${port}`, async () => {
      const r = await this.#signed.resolve(token, port);
      return r && { sandboxId: r.sandboxId, expiresAt: r.expiresAt.getTime() };
    });
    if (!hit || hit.expiresAt <= Date.now()) throw errors.permissionDenied("Invalid or expired token");
    return hit.sandboxId;
  }

  /** Where the port is reached; 503 with the sandbox's state when it is not running. */
  async endpoint(sandbox: PreviewSandbox, port: number): Promise<PortEndpoint> {
    // A paused sandbox is resumed by the agent lookup below (auto-resume): the request waits.
    const paused = sandbox.state === "paused" && (sandbox.desiredState === "paused" || sandbox.desiredState === "started");
    if (paused) this.forget(sandbox.id);
    else if (sandbox.state !== "started" || sandbox.desiredState !== "started") {
      throw errors.unavailable(`Sandbox ${sandbox.id} is not running (state: ${reportedState(sandbox.state, sandbox.desiredState)}); start it to reach its ports`);
    }
    const at = await this.#cached(this.#endpoints, sandbox.id, async () => {
      const agent = await this.#manager.agentFor(sandbox.organizationId, sandbox.id).catch(() => {
        throw errors.unavailable(`Sandbox ${sandbox.id} is not running; start it to reach its ports`);
      });
      return { key: agent.key, secret: agent.secret, tunnel: agent.tunnel };
    });
    return { sandboxId: sandbox.id, port, agent: at };
  }

  /** Forgets what was read about a sandbox (its agent went away). */
  forget(sandboxId: string): void {
    this.#sandboxes.delete(sandboxId);
    this.#endpoints.delete(sandboxId);
  }

  async #cached<T>(map: Map<string, Entry<T>>, key: string, load: () => Promise<T>): Promise<T> {
    const now = Date.now();
    const hit = map.get(key);
    if (hit && hit.until > now) return hit.value;
    const value = await load();
    if (map.size >= MAX_ENTRIES) map.clear();
    map.set(key, { value, until: now + this.#ttlMs });
    return value;
  }
}
