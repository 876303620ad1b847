// `sandbar runner`'s daemon (start.ts, the server and its services) and the runner's wire that
// control's client (control/src/runners/remote-runtime.ts) speaks to it.
export { startRunner, type Runner, type RunnerHostRuntime } from "./start.ts";
export { loadRunnerHostSettings, type RunnerHostSettings } from "./settings.ts";
export { AGENT_API_PATH, AGENT_TUNNEL_PATH, ERROR_HEADER, SANDBOX_ID_HEADER, openAgentStream } from "./agent-streams.ts";
export { changesPartFromProto, networkToProto, resourcesToProto, specToProto, statusFromProto } from "./convert.ts";
export { snapshotInfo } from "./snapshot-service.ts";
