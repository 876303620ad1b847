import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client, type Transport } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import type { AgentDial } from "../sandboxes/runtime.ts";
import { createAgentTransport } from "../grpc-wire/index.ts";
import { SendBudget } from "./send-budget.ts";

/** Open connections kept to agents; the least recently used beyond this are closed. */
const MAX_AGENTS = 512;
/**
 * Upload bytes one connection holds in node's stream queues at most (send-budget.ts): twice the
 * agent's connection window (its CONNECTION_WINDOW_SIZE), so queued frames still keep it full.
 */
const UPLOAD_QUEUE_BYTES = 8 * 1024 * 1024;
/**
 * maxSessionMemory of a connection to an agent, in MB: the upload queue, plus room for what other
 * calls queue (unary requests, a stream's current message) and nghttp2's own state. Node refuses
 * any HEADERS arriving past it (the answers to calls in flight among them).
 */
const SESSION_MEMORY_MB = 32;

interface Entry {
  manager: Http2SessionManager;
  budget: SendBudget;
  /** Connect's transport over the connection (streams and uploads; unary calls take the session itself). */
  transport: Transport;
}

/**
 * gRPC clients of the agents, one HTTP/2 connection per agent (by its dial's key), kept open between calls
 * (a toolbox call then costs one stream, not a connection).
 */
export class AgentClients {
  private readonly entries = new Map<string, Entry>();

  /** A client over the agent's kept connection (a client is a few closures; the connection is what is kept). */
  client<S extends DescService>(service: S, agent: Pick<AgentDial, "key" | "api">): Client<S> {
    return createClient(service, this.entry(agent).transport);
  }

  /** The agent's HTTP/2 session, for calls made without a Connect client (agent-unary.ts). */
  session(agent: Pick<AgentDial, "key" | "api">): Http2SessionManager {
    return this.entry(agent).manager;
  }

  private entry(agent: Pick<AgentDial, "key" | "api">): Entry {
    const socket = agent.key;
    let entry = this.entries.get(socket);
    if (entry) {
      this.entries.delete(socket); // re-insert: most recently used last
    } else {
      const manager = new Http2SessionManager("http://agent", { idleConnectionTimeoutMs: 60_000 }, {
        createConnection: () => agent.api(),
        settings: { initialWindowSize: 1024 * 1024 },
        maxSessionMemory: SESSION_MEMORY_MB,
      });
      const budget = new SendBudget(UPLOAD_QUEUE_BYTES);
      entry = { manager, budget, transport: createAgentTransport(manager, budget) };
      if (this.entries.size >= MAX_AGENTS) this.forget(this.entries.keys().next().value!);
    }
    this.entries.set(socket, entry);
    return entry;
  }

  forget(key: string): void {
    const socket = key;
    this.entries.get(socket)?.manager.abort();
    this.entries.delete(socket);
  }

  close(): void {
    for (const socket of [...this.entries.keys()]) this.forget(socket);
  }
}
