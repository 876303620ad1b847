export type {
  BindMount,
  InitCommand,
  NetworkMode,
  SandboxInfo,
  SandboxProvider,
  SandboxSpec,
  SandboxState,
  SandboxUsage,
  StartOptions,
  StopOptions,
} from "./provider.ts";
export { SANDBOX_PATHS } from "./provider.ts";
export { MAX_LAYERS, validateSpec } from "./spec.ts";
export type { HostOptions, ProviderOpener } from "./host/sandbox-host.ts";
