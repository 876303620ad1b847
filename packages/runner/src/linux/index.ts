export type { LinuxProviderOptions, StartPhase } from "./provider.ts";
export { LinuxProvider } from "./provider.ts";
export type { DefaultSnapshotOptions, Snapshot } from "./rootfs.ts";
export { buildHostUsrRootfs, DEFAULT_PACKAGES, ensureDefaultSnapshot } from "./rootfs.ts";
export type { CgroupBackend } from "./cgroups/types.ts";
export { DEFAULT_STAGING_DIR, reachableByOthers, reachablePath } from "./stage.ts";
export { checkHost, formatChecks, type HostCheck } from "./host-check.ts";
