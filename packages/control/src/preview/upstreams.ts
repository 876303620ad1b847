import { Agent, type AgentOptions } from "node:http";
import type { Duplex } from "node:stream";
import type { AgentDial } from "../sandboxes/runtime.ts";
import { dialTunnel } from "./tunnel-dial.ts";

/** Where a sandbox port is reached: its agent (whose tunnel is dialed) and the port. */
export interface PortEndpoint {
  sandboxId: string;
  port: number;
  agent: TunnelDial;
}

/** What dialing a tunnel needs of an agent. */
export type TunnelDial = Pick<AgentDial, "key" | "secret" | "tunnel">;

/** Idle keep-alive connections kept per sandbox port. */
const MAX_IDLE_PER_PORT = 32;
/** Ports whose agents are kept; the least recently used beyond this are closed. */
const MAX_PORTS = 1024;

/**
 * One keep-alive http.Agent per sandbox port whose connections are tunnels: a request reuses an
 * idle tunnel when there is one, else dials a new one (a stream to the agent, which connects
 * to the port inside the sandbox). The agent's key is part of the key, so a
 * restarted sandbox gets fresh connections.
 */
export class Upstreams {
  readonly #agents = new Map<string, Agent>();

  agentFor(e: PortEndpoint): Agent {
    const key = `${e.sandboxId}:${e.port}:${e.agent.key}`;
    let agent = this.#agents.get(key);
    if (agent) {
      // Most recently used last (Map keeps insertion order).
      this.#agents.delete(key);
      this.#agents.set(key, agent);
      return agent;
    }
    agent = new TunnelAgent(e, { keepAlive: true, maxFreeSockets: MAX_IDLE_PER_PORT, keepAliveMsecs: 1000, timeout: 0, scheduling: "lifo" });
    this.#agents.set(key, agent);
    if (this.#agents.size > MAX_PORTS) {
      const [oldest, old] = this.#agents.entries().next().value!;
      this.#agents.delete(oldest);
      old.destroy();
    }
    return agent;
  }

  /** Drops a sandbox's connections (it stopped, or its agent went away). */
  forget(sandboxId: string): void {
    for (const [key, agent] of this.#agents) {
      if (key.startsWith(sandboxId + ":")) {
        this.#agents.delete(key);
        agent.destroy();
      }
    }
  }

  close(): void {
    for (const agent of this.#agents.values()) agent.destroy();
    this.#agents.clear();
  }
}

class TunnelAgent extends Agent {
  readonly #endpoint: PortEndpoint;
  constructor(endpoint: PortEndpoint, options: AgentOptions) {
    super(options);
    this.#endpoint = endpoint;
  }

  // The asynchronous form: the connection is handed over once the agent has reached the port, so a
  // port nobody listens on fails the request with the agent's reason.
  override createConnection(_options: unknown, callback: (err: Error | null, socket?: Duplex) => void): Duplex | undefined {
    const { agent, port } = this.#endpoint;
    dialTunnel(agent, port).then(
      (socket) => {
        callback(null, socket);
        socket.resume();
      },
      (err: Error) => callback(err),
    );
    return undefined;
  }
}
