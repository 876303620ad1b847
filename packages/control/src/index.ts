export { startControlServer, API_BASE, type ControlServer } from "./server/control-server.ts";
export { loadSettings, type Settings } from "./settings.ts";
export { openRunnerRuntime } from "./sandboxes/boot.ts";
