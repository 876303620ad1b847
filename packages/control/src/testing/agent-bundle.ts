export { buildAgentBundle } from "@sandbar/agent/testing";
