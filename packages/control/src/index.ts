export { startControlServer, API_BASE, type ControlServer } from "./server/control-server.ts";
export { loadSettings, type Settings } from "./settings.ts";
export { startRunner, type Runner } from "./runner-host/start.ts";
export { loadRunnerHostSettings } from "./runner-host/settings.ts";
