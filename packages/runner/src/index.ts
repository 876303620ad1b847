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
export { readChangeset, type ChangesFormat, type ChangesPart, type ChangesQuery } from "./host/changeset.ts";
export type { Change, ChangeKind, ChangeType } from "./host/changes.ts";
