// @sandbar/sdk: Sandbar's TypeScript client over gRPC. Request and response types are the
// generated ones of @sandbar/protocol, re-exported here so a program needs only this import.
export { Sandbar, type SandbarClientOptions } from "./sandbar.ts";
export {
  resolveConfig,
  defaultConfigDir,
  readConfigFile,
  writeConfigFile,
  saveProfile,
  parseDotenv,
  DEFAULT_API_URL,
  CONFIG_FILE_NAME,
  type SandbarOptions,
  type ResolvedConfig,
  type ConfigFile,
  type ConfigProfile,
  type ConfigSource,
} from "./config.ts";
export {
  SandbarError,
  NotFoundError,
  UnauthenticatedError,
  PermissionDeniedError,
  InvalidArgumentError,
  RateLimitedError,
  TimeoutError,
  CanceledError,
  ConfigurationError,
  toSandbarError,
  type ErrorCode,
} from "./errors.ts";
export { isIdempotent, retryInterceptor, type RetryOptions, type RetryInfo } from "./retry.ts";
export { createSandbarTransport, credentialsInterceptor, ORGANIZATION_HEADER, SANDBOX_HEADER, type TokenProvider } from "./transport.ts";
export { sandbarClient } from "./clients.ts";
export { Sandboxes, type ListSandboxesParams } from "./sandboxes.ts";
export { Sandbox, waitForState, type CreateSandboxParams, type WaitOptions } from "./sandbox.ts";
export { Snapshots, Volumes, ApiKeys, Organizations, permissionOf, type Scope } from "./resources.ts";
export { Changes, type ChangesOptions } from "./changes.ts";
export { FileSystem, type TransferOptions } from "./toolbox/fs.ts";
export { Processes, type ExecOptions } from "./toolbox/process.ts";
export { Ptys, PtyHandle, type PtyCreateOptions } from "./toolbox/pty.ts";
export { CHUNK_BYTES, type UploadSource } from "./toolbox/chunks.ts";
export type { CallOptions } from "@connectrpc/connect";

// Generated types and enums a program meets in answers.
export { SandboxState, type Sandbox as SandboxInfo, type CreateSandboxRequest } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
export { SnapshotState, type Snapshot, type PaginatedSnapshots } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
export { VolumeState, type Volume } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
export type { ApiKey, CreateApiKeyResponse } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
export { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
export type { Organization, OrganizationUsageOverview } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
export type { FileInfo, UploadedFile } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
export type { ExecuteResponse, LogChunk, Session, SessionExecuteResponse, Command } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
export type { PtyEvent, PtySessionInfo } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
export type { SandboxChange, SandboxChangeList } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
export type { GitStatus } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";
