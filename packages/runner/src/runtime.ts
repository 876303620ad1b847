import type { Duplex, Readable } from "node:stream";
import type { BuildSnapshotRequest, LogChunk, SnapshotProgress } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { ChangesPart, ChangesQuery } from "./host/changeset.ts";
import type { ImageStore, RegistryCredentials } from "./images/index.ts";

// What the control plane needs from a host that runs sandboxes: control's LocalRuntime (this
// host, over a SandboxProvider; also what a `sandbar runner` process serves, daemon/) and
// RemoteRuntime (a runner process, over its gRPC port). The runner's daemon serves any
// implementation of it, so it lives here, beside the provider contract.
// Every method may be called again after a crash: the host's state is on its disk.

/** How a sandbox is made: from the default snapshot, or from a pulled image. */
export interface RuntimeSandboxSpec {
  /** The sandbox id (a UUID), also its name on the host. */
  id: string;
  /** Cores. */
  cpu: number;
  /** GiB. */
  memoryGiB: number;
  /** GiB: the cap of the writable layer. */
  diskGiB: number;
  env: Record<string, string>;
  /** OS user inside the sandbox. */
  user: string;
  /** Volumes mounted read-write (ids resolved; paths checked by volumes/mount-paths.ts). */
  volumes?: Array<{ volumeId: string; mountPath: string; subpath?: string }>;
  /** The image's manifest digest in the host's image store; absent: the default snapshot. */
  image?: string;
  /** Default: loopback only. */
  network?: RuntimeNetwork;
  /** Captured layers (captureLayer's ids), top first, stacked above the image: a fork's, a running sandbox's snapshot's. */
  layers?: string[];
}

/** Egress of a sandbox: "none" loopback only, "full" anywhere outside the host, "allow-list" only those IPv4 CIDRs. */
export interface RuntimeNetwork {
  mode: "none" | "full" | "allow-list";
  allowList: string[];
}

/** Cores and GiB, as in RuntimeSandboxSpec. */
export interface RuntimeResources {
  cpu?: number;
  memoryGiB?: number;
  diskGiB?: number;
}

export type RuntimeState = "created" | "started" | "stopped" | "paused" | "error";

export interface RuntimeSandbox {
  id: string;
  /** "error": meant to run, but its first process is gone (see `error`). */
  state: RuntimeState;
  error?: string;
  /** The root it boots from (lists of this host's runtime: which image a sandbox uses). */
  rootfs?: string;
  /** While started: what its workload did to it (see SandboxHealth in the contract). */
  health?: RuntimeHealth;
  /** While paused: host memory it still holds, and what its pause gave back (when known). */
  pausedMemory?: { residentBytes: number; reclaimedBytes?: number };
}

export interface RuntimeHealth {
  agentRunning: boolean;
  agentRestarts: number;
  lastAgentRestartAt?: Date;
  oomKills: number;
  pidsLimitHits: number;
  memoryBytes: number;
  memoryLimitBytes: number;
  pids: number;
  pidsLimit: number;
  /** The user's processes are at their own pids limit now. */
  pidsSaturated: boolean;
}

export interface SandboxRuntime {
  /** Stable id of this host's runner (recorded on each sandbox it holds). */
  readonly runnerId: string;
  /**
   * Whether its agents' sockets are on this host: a dial to one stays good until the sandbox's row
   * changes, so the toolbox may keep it between calls. A remote runner's dial goes through a
   * connection that can fail on its own, so it is asked for each call.
   */
  readonly agentsOnThisHost: boolean;
  /** Throws UNAVAILABLE with the reason when sandboxes cannot be made here. */
  assertReady(): Promise<void>;
  /** Creates the sandbox (or finds it, after an interrupted create) and starts it. */
  create(spec: RuntimeSandboxSpec): Promise<void>;
  /** Starts a stopped sandbox; a running one is left alone. */
  start(id: string): Promise<void>;
  /** Ends every process of the sandbox; its files stay. */
  stop(id: string, options?: { force?: boolean }): Promise<void>;
  /** Removes everything the sandbox has on the host; unknown ids are fine. */
  destroy(id: string): Promise<void>;
  /** Freezes a started sandbox's processes and reclaims its memory; a paused one is left as it is. */
  pause(id: string): Promise<void>;
  /** Thaws a paused sandbox; its processes, sessions and memory are as they were. */
  resume(id: string): Promise<void>;
  /**
   * Where the host can tell: destroys the sandboxes nothing claims (as `destroy`, a failure
   * logged rather than thrown), removes what else earlier runs left for this runtime (remains of
   * sandboxes, loop devices), and logs what by kind. Returns the ids destroyed.
   */
  removeLeftovers?(unclaimed: string[]): Promise<string[]>;
  /** The environment the sandbox's processes start with, from its next start on. */
  setEnv(id: string, env: Record<string, string>): Promise<void>;
  /** Changes the sandbox's network policy: at once if it runs with egress, else from its next start. */
  setNetwork(id: string, network: RuntimeNetwork): Promise<void>;
  /**
   * New resources, kept for every later start: cpu and memory at once in a running sandbox (its
   * cgroup), the disk cap grown only while it is stopped. Absent fields stay as they are.
   */
  resize(id: string, resources: RuntimeResources): Promise<void>;
  /** The writable layer as a tar stream. */
  pack(id: string): Promise<Readable>;
  /** Makes the sandbox (not started) with its writable layer from a `pack` stream. */
  restore(spec: RuntimeSandboxSpec, archive: Readable): Promise<void>;
  /**
   * What the sandbox changed since its creation, read from its upper layer (host/changeset.ts):
   * entries (format "list") or the bytes of a tar or a diff, streamed. Started or stopped.
   */
  changes?(id: string, query: ChangesQuery): AsyncIterable<ChangesPart>;
  /** Every sandbox the host holds; undefined from `inspect` when it holds none by that id. */
  list(): Promise<RuntimeSandbox[]>;
  inspect(id: string): Promise<RuntimeSandbox | undefined>;
  /** How to reach the started sandbox's agent (FAILED_PRECONDITION when it is not started). */
  connectAgent(id: string): Promise<AgentDial>;
  /** Releases what the runtime holds beyond its sandboxes (which keep running). */
  close(): Promise<void>;
  /**
   * Copies the sandbox's writable layer into a new read-only layer `layerId` on this host (the
   * sandbox frozen for that instant while it runs; stopped, as it is). INVALID_ARGUMENT where the
   * provider cannot (Docker).
   */
  captureLayer(id: string, layerId: string): Promise<void>;
  /** Merges captured layers (top first) into one new layer: what keeps a stack's depth bounded. */
  squashLayers(layerIds: string[], layerId: string): Promise<void>;
  /** Removes captured layers from this host; unknown ids are fine. */
  removeLayers(layerIds: string[]): Promise<void>;
  /** The captured layers this host holds, with when each was made. */
  listLayers(): Promise<Array<{ id: string; createdAt: Date }>>;
  /**
   * Makes an OCI image of captured layers (top first) over their base (an image by manifest digest;
   * absent: the default root filesystem) and pushes it: what lets a snapshot of a running sandbox
   * travel to runners without its layers. Answers the pushed manifest's digest.
   */
  exportLayers?(req: LayerExport): Promise<{ digest: string; layers: number; bytes: number }>;
  /** The host's image store (snapshots from OCI images); absent where images cannot be pulled. */
  images?(): Promise<ImageStore>;
  /** Whether the host's image store holds an image (by manifest digest). */
  holdsImage?(digest: string): Promise<boolean>;
  /** Pulls `name` (pinned to `digest`) into the host's store; the credentials serve this pull only. */
  pullImage?(digest: string, name: string, credentials?: RegistryCredentials): Promise<void>;
  /** Such a runner drops an image from its store (refused while one of its sandboxes uses it). */
  removeImage?(digest: string): Promise<void>;
  /**
   * Runs a declarative build on this host (BuildSnapshot: the spec, then each context's bytes):
   * its output lines, then the built image's info. The same call in-process and on a runner.
   */
  buildSnapshot?(requests: AsyncIterable<BuildSnapshotRequest>, signal: AbortSignal): AsyncIterable<SnapshotProgress>;
  /** A build's log on this host by its ref (GetSnapshotLogs). */
  snapshotLogs?(ref: string, follow: boolean, signal: AbortSignal): AsyncIterable<LogChunk>;
}

/**
 * A started sandbox's agent, wherever it runs: new byte streams to its API (the agent's HTTP/2)
 * and to its port tunnel (tunnel.ts's header line, then raw bytes). Each call opens a stream at
 * once (a unix socket here, an HTTP/2 stream to a runner): connection pools call it synchronously.
 */
export interface AgentDial {
  /** Same for every dial of one running agent: the key connections are kept under. */
  readonly key: string;
  /** The bearer secret the agent expects. Never stored per sandbox; never logged. */
  readonly secret: string;
  api(): Duplex;
  tunnel(): Duplex;
}

/** What exportLayers makes and where it goes; the credentials serve this push only. */
export interface LayerExport {
  /** Captured layer ids, top first. */
  layers: string[];
  /** The base image's manifest digest; absent: the default snapshot's root. */
  image?: string;
  /** The sandbox user: files of the layers' author are written as that user's (its uid in the base). */
  user: string;
  push: { image: string; credentials?: RegistryCredentials };
}
