export { startAgent } from "./agent.ts";
export { agentTransport } from "./client.ts";
export type { Agent, AgentOptions } from "./agent.ts";
export type { AgentContext } from "./context.ts";
export { LineMarker, stripMarkers, STDOUT_MARK, STDERR_MARK } from "./sessions/markers.ts";
export { AGENT_VERSION } from "./version.ts";
