import type { Readable } from "node:stream";
import type { ChangeLayers } from "./host/changes.ts";

// The contract between the control plane and a sandbox provider (linux: bubblewrap and cgroups;
// docker: containers of an engine). Control holds a provider only through this interface, so a
// new provider is a new implementation and an opener (ProviderOpener), nothing else.
// Sandboxes are named by the caller's id; every method is safe to call again after a crash
// (state lives on disk and in the kernel, not in the provider object).

/**
 * Network modes: "none" is loopback only; "full" reaches anything outside the host (NAT);
 * "allow-list" only `networkAllowList`. Never the host itself nor another sandbox (host/network.ts).
 */
export type NetworkMode = "none" | "full" | "allow-list";

/** A host path made visible inside the sandbox. */
export interface BindMount {
  /** Absolute host path (file or directory). */
  source: string;
  /** Absolute path inside the sandbox. */
  target: string;
  /** Default true. */
  readonly?: boolean;
}

/**
 * A volume: a host directory shared by every sandbox that mounts it. The provider makes `subpath`
 * (created if missing, never through a symlink that leaves `root`) visible read-write at `target`,
 * and lets the sandbox's processes write what other sandboxes wrote (a group shared by volume users).
 */
export interface VolumeMount {
  /** Absolute host path of the volume's root directory. */
  root: string;
  /** Relative path inside the volume; its root when absent. */
  subpath?: string;
  /** Absolute path inside the sandbox. */
  target: string;
}

/**
 * The sandbox's first process: the agent, run by the host's node binary from a bundle,
 * both bind-mounted read-only. The provider adds `--socket <path>` (and `--secret-file <path>`
 * when a secret is given) before `args`; the agent must listen on that unix socket.
 */
export interface InitCommand {
  /** Host path of the node binary. */
  node: string;
  /** Host path of the agent bundle: one script file, or a directory holding `main`. */
  bundle: string;
  /** Script inside the bundle directory (relative); required when `bundle` is a directory. */
  main?: string;
  /** Flags for node itself, placed before the script. */
  nodeArgs?: string[];
  /** Arguments for the agent, after the provider's own. */
  args?: string[];
  /** Written to a file readable by the sandbox user and passed as `--secret-file`. */
  secret?: string;
}

export interface SandboxSpec {
  /** Letters, digits, `_`, `.`, `-`; starts with a letter or digit; at most 63 characters. */
  id: string;
  /** Host directory holding the snapshot's root filesystem (the read-only lower layer). */
  rootfs: string;
  /**
   * Captured layers (captureLayer's ids), top first, stacked read-only between the writable layer
   * and `rootfs`. Every layer of a stack belongs to one host uid (the sandbox it was captured
   * from): a sandbox made on them runs as that uid, so it owns their files as their author did.
   */
  layers?: string[];
  /** Extra binds, applied in order after the root (a snapshot's own binds go first). */
  mounts?: BindMount[];
  /** Shared volumes, read-write, after the binds (see VolumeMount). */
  volumes?: VolumeMount[];
  /** CPU cores, may be fractional (0.5 = half a core). */
  cpu: number;
  /** Memory limit in GiB (swap is not granted on top). */
  memoryGiB: number;
  /** Hard cap of the writable layer in GiB; unlimited when absent. */
  diskGiB?: number;
  /** Maximum number of processes and threads. */
  pidsLimit: number;
  /** The sandbox's environment (nothing of the host's leaks in). */
  env?: Record<string, string>;
  /** Default "none". */
  network?: NetworkMode;
  /** IPv4 CIDRs (a.b.c.d/n) reachable in mode "allow-list". */
  networkAllowList?: string[];
  /** OS user inside the sandbox; default "sandbar". "root" is uid 0 inside, still without capabilities. */
  user?: string;
  /** The first process's working directory (an image's WORKDIR; the agent's work dir); default the user's home. */
  workdir?: string;
  init: InitCommand;
}

export type SandboxState =
  | "created" // prepared, never started (or restored and not yet started)
  | "started" // processes are running
  | "stopped" // stopped on request; the writable layer is kept
  | "paused" // every process frozen (cgroup freezer / docker pause); resume thaws them as they were
  | "error"; // meant to run, but its first process is gone (see `error`)

/** Live counters from the sandbox's cgroup, since its last start. */
export interface SandboxUsage {
  memoryBytes: number;
  memoryPeakBytes?: number;
  memoryLimitBytes: number;
  /** Processes killed by the OOM killer inside this sandbox. */
  oomKills: number;
  pids: number;
  pidsLimit: number;
  /** Forks refused because the pids limit was reached. */
  pidsLimitHits: number;
  /**
   * The user's processes are at their pids limit now, so their forks are refused (a fork bomb
   * holds it there): the user leaf's on the linux provider, the container's on Docker.
   */
  pidsSaturated?: boolean;
  cpuUsageUsec?: number;
  cpuPeriods: number;
  cpuThrottledPeriods: number;
  cpuThrottledUsec: number;
}

export interface SandboxInfo {
  id: string;
  state: SandboxState;
  /** Why the sandbox is in state "error". */
  error?: string;
  createdAt: Date;
  startedAt?: Date;
  /** Host uid the sandbox's processes and files run as. */
  hostUid: number;
  /** The spec it was created with (the secret is never echoed). */
  spec: SandboxSpec;
  /** Present while started. */
  usage?: SandboxUsage;
  /** The agent, while started: user code can kill it (same uid); the sandbox's init restarts it. */
  agent?: AgentHealth;
  /** While paused: the memory it still holds on the host. */
  paused?: PausedMemory;
}

/** A paused sandbox's memory: what the pause gave back to the host, and what stays. */
interface PausedMemory {
  /** Host memory the frozen sandbox holds now (anonymous memory stays without swap). */
  residentBytes: number;
  /** What the pause's reclaim gave back (page cache); absent when not measured by this process. */
  reclaimedBytes?: number;
  /** How memory was reclaimed: "memory.reclaim" (cgroup v2), "limit" (v1), "none". */
  method?: string;
}

interface AgentHealth {
  /** Whether an agent process runs now (false while its supervisor waits to restart it). */
  running: boolean;
  /** Restarts by the supervisor since the sandbox started. */
  restarts: number;
  lastRestartAt?: Date;
}

export interface StartOptions {
  /** How long to wait for the agent's socket to accept connections; default 30 s. */
  timeoutMs?: number;
}

export interface StopOptions {
  /** Skip the polite SIGTERM and kill at once. */
  force?: boolean;
  /** Time between SIGTERM and SIGKILL; default 5 s. */
  graceMs?: number;
}

/** New resources of a sandbox (absent: unchanged), in SandboxSpec's units. */
export interface SandboxResources {
  cpu?: number;
  memoryGiB?: number;
  diskGiB?: number;
}

export interface SandboxProvider {
  readonly name: string;
  /** Prepares the sandbox (writable layer, disk cap, identity) without starting it. */
  create(spec: SandboxSpec): Promise<SandboxInfo>;
  /** Mounts, launches the first process and waits for its socket. A started sandbox is left alone. */
  start(id: string, options?: StartOptions): Promise<SandboxInfo>;
  /** Kills every process of the sandbox and unmounts it; files survive. */
  stop(id: string, options?: StopOptions): Promise<SandboxInfo>;
  /** Removes everything the sandbox had on the host; unknown ids are fine. */
  destroy(id: string): Promise<void>;
  /**
   * Freezes every process of a started sandbox and gives what memory it can back to the host.
   * A paused sandbox is left as it is; stop and destroy work on it. It stays paused across a
   * restart of the provider.
   */
  pause(id: string): Promise<SandboxInfo>;
  /** Lets a paused sandbox's processes run on as they were; a started one is left alone. */
  resume(id: string): Promise<SandboxInfo>;
  /**
   * Destroys the sandboxes `unclaimed` names (a failure logged rather than thrown) and removes
   * what else earlier runs left on the host for this provider. Returns the ids destroyed.
   */
  removeLeftovers(unclaimed?: readonly string[]): Promise<string[]>;
  inspect(id: string): Promise<SandboxInfo>;
  /** Every sandbox this provider holds, for reconciliation with the control plane. */
  list(): Promise<SandboxInfo[]>;
  /**
   * Replaces the environment the sandbox's first process gets, from its next start on (a running
   * agent is told separately, over its own API).
   */
  setEnv(id: string, env: Record<string, string>): Promise<void>;
  /**
   * Changes the sandbox's egress, kept for every later start and applied at once while it runs.
   * Returns whether it took effect now (false: not running).
   */
  updateNetwork(id: string, network: NetworkMode, allowList?: string[]): Promise<boolean>;
  /**
   * Changes cpu, memory or the disk cap, kept for every later start. cpu and memory take effect at
   * once in a running sandbox (its cgroup); the disk cap only grows, and only while it is not running.
   */
  resize(id: string, resources: SandboxResources): Promise<SandboxInfo>;
  /** The writable layer as a tar stream (for archive and backup). */
  pack(id: string): Promise<Readable>;
  /** Replaces the writable layer of a sandbox that is not running with a `pack` stream. */
  restore(id: string, archive: Readable): Promise<void>;
  /**
   * The layers a changeset of the sandbox reads (host/changeset.ts): its upper, the layers below
   * it (its captured layers, its image) and the platform's own paths; started or stopped (the
   * upper stays on disk). `consistent` freezes a running sandbox until `release` (a paused one
   * stays as it is); `since` names a checkpoint's layers to compare with. Absent: not offered.
   */
  changeLayers?(id: string, options?: ChangeLayerOptions): Promise<ChangeSource>;
  /**
   * Copies the sandbox's writable layer into a new read-only layer `layerId`, the sandbox frozen
   * (cgroup freezer) for that instant when it runs. The layer appears whole or not at all.
   * Absent: this provider cannot capture (the caller answers 400).
   */
  captureLayer?(id: string, layerId: string): Promise<void>;
  /** Merges `layerIds` (top first) into one new layer `layerId`, whiteouts kept: the depth bound. */
  squashLayers?(layerIds: string[], layerId: string): Promise<void>;
  /** Removes layers; unknown ids are fine. The caller keeps those a sandbox or snapshot still uses. */
  removeLayers?(layerIds: string[]): Promise<void>;
  /** Ids of the layers this provider holds, with when each was made. */
  listLayers?(): Promise<Array<{ id: string; createdAt: Date }>>;
  /** Where a captured layer lies (overlayfs form) and the host uid owning its files: what an export to an OCI image reads. */
  layerSource?(layerId: string): Promise<{ root: string; uid: number }>;
  /** Host path of the agent's unix socket; the sandbox must be started. */
  connect(id: string): Promise<string>;
  /** Releases host resources the provider holds beyond its sandboxes (sandboxes keep running). */
  close(): Promise<void>;
}

/** How a changeset read holds the sandbox's layers. */
export interface ChangeLayerOptions {
  /** Freeze a running sandbox until release (a paused one stays as it is). */
  consistent?: boolean;
  /** Compare with these captured layers (top first) on the sandbox's image, not with its own stack. */
  since?: string[];
}

/** A sandbox's layers, held for one changeset read: `release` (once, always) lets go of them. */
export interface ChangeSource {
  layers: ChangeLayers;
  release(): Promise<void>;
}

/** Where the provider puts things inside every sandbox. */
export const SANDBOX_PATHS = {
  /** Bind of the sandbox's runtime directory on the host; holds the agent socket. */
  runDir: "/run/sandbar",
  agentSocket: "/run/sandbar/agent.sock",
  secretFile: "/run/sandbar/secret",
  node: "/opt/sandbar/bin/node",
  /** The host's sh, run as the namespace's pid 1: it reaps orphans and restarts the agent. */
  init: "/opt/sandbar/bin/init-sh",
  agent: "/opt/sandbar/agent",
  /** How many times the init restarted the agent since the start (written by the init). */
  agentRestarts: "/run/sandbar/agent-restarts",
  /** The agent's state (session logs), on the sandbox's disk: it outlives an agent restart. */
  agentState: "/tmp/.sandbar-agent",
  /** Binds of the user cgroup leaf's procs files (`0`, `1`, ...): the agent's `--user-cgroup`. */
  userCgroupDir: "/opt/sandbar/cgroup",
} as const;

/** What the platform writes into every sandbox's upper: never reported as the user's changes. */
export const PLATFORM_PATHS: readonly string[] = ["/run/sandbar", "/opt/sandbar", SANDBOX_PATHS.agentState];

/** The user entry and home the platform makes at start (host/rootprep.ts ensureUser), for changesets. */
export function platformUser(user = "sandbar"): { name: string; home: string } {
  return { name: user, home: user === "root" ? "/root" : `/home/${user}` };
}
