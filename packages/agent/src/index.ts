export { startAgent } from "./agent.ts";
export { agentTransport } from "./client.ts";
export type { Agent, AgentOptions } from "./agent.ts";
export type { AgentContext } from "./context.ts";
export { AGENT_VERSION } from "./version.ts";
