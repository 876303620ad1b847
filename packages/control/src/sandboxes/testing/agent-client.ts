import { connect } from "node:net";
import type { Duplex } from "node:stream";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";

// Runs a shell command in a sandbox through its agent's unix socket: the agent's own
// ProcessService/Execute over Connect (HTTP/2, JSON), with the sandbox's bearer secret.

/** A unix socket path, or any dial (a remote runner's agent stream). */
export type AgentAddress = { secret: string } & ({ socket: string } | { api(): Duplex });

export async function sh(agent: AgentAddress, command: string): Promise<{ exitCode: number; result: string }> {
  const sessions = new Http2SessionManager("http://agent", undefined, { createConnection: () => ("socket" in agent ? connect(agent.socket) : agent.api()) });
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${agent.secret}`);
    return next(req);
  };
  try {
    const client = createClient(ProcessService, createConnectTransport({ baseUrl: "http://agent", httpVersion: "2", useBinaryFormat: false, sessionManager: sessions, interceptors: [auth] }));
    const res = await client.execute({ command }, { timeoutMs: 30_000 });
    return { exitCode: res.exitCode, result: res.result };
  } finally {
    sessions.abort();
  }
}
