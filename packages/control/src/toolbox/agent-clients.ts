import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import type { AgentDial } from "../sandboxes/runtime.ts";
import { createAgentTransport } from "./agent-transport.ts";

/** Open connections kept to agents; the least recently used beyond this are closed. */
const MAX_AGENTS = 512;

interface Entry {
  manager: Http2SessionManager;
  clients: Map<string, Client<DescService>>;
}

/**
 * gRPC clients of the agents, one HTTP/2 connection per agent (by its dial's key), kept open between calls
 * (a toolbox call then costs one stream, not a connection).
 */
export class AgentClients {
  private readonly entries = new Map<string, Entry>();

  client<S extends DescService>(service: S, agent: Pick<AgentDial, "key" | "api">): Client<S> {
    const entry = this.entry(agent);
    let client = entry.clients.get(service.typeName);
    if (!client) {
      const transport = createAgentTransport(entry.manager);
      client = createClient(service, transport) as unknown as Client<DescService>;
      entry.clients.set(service.typeName, client);
    }
    return client as unknown as Client<S>;
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
      });
      entry = { manager, clients: new Map() };
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
