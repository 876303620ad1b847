import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { errors } from "@sandbar/protocol";
import {
  type Network,
  type Resources,
  ResourcesSchema,
  NetworkMode,
  NetworkSchema,
  type SandboxSpec,
  SandboxSpecSchema,
  SandboxState,
  type SandboxStatus,
  SandboxStatusSchema,
  type SandboxChangesPart,
  SandboxChangesPartSchema,
} from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import type { ChangesPart } from "../host/changeset.ts";
import type { ChangeKind, ChangeType } from "../host/changes.ts";
import type { RuntimeNetwork, RuntimeResources, RuntimeSandbox, RuntimeSandboxSpec, RuntimeState } from "../runtime.ts";

// The runner protocol's messages and the runtime's types, both ways: the runner serves a
// SandboxRuntime with them, RemoteRuntime reads its answers back. Sizes travel in MiB and
// millicores (the protocol's units), the runtime counts cores and GiB.

const MIB_PER_GIB = 1024;

export function specToProto(s: RuntimeSandboxSpec): SandboxSpec {
  return create(SandboxSpecSchema, {
    id: s.id,
    snapshotRef: s.image ?? "",
    resources: { cpuMillicores: Math.round(s.cpu * 1000), memoryMib: Math.round(s.memoryGiB * MIB_PER_GIB), diskMib: Math.round(s.diskGiB * MIB_PER_GIB) },
    env: s.env,
    user: s.user,
    volumes: (s.volumes ?? []).map((v) => ({ volumeId: v.volumeId, mountPath: v.mountPath, subpath: v.subpath ?? "" })),
    ...(s.network ? { network: networkToProto(s.network) } : {}),
    layers: s.layers ?? [],
  });
}

/** A resize: absent figures travel as zero, which the protocol reads as "unchanged". */
export function resourcesToProto(r: RuntimeResources): Resources {
  return create(ResourcesSchema, {
    cpuMillicores: r.cpu === undefined ? 0 : Math.round(r.cpu * 1000),
    memoryMib: r.memoryGiB === undefined ? 0 : Math.round(r.memoryGiB * MIB_PER_GIB),
    diskMib: r.diskGiB === undefined ? 0 : Math.round(r.diskGiB * MIB_PER_GIB),
  });
}

export function resourcesFromProto(r: Resources | undefined): RuntimeResources {
  return {
    ...(r?.cpuMillicores ? { cpu: r.cpuMillicores / 1000 } : {}),
    ...(r?.memoryMib ? { memoryGiB: r.memoryMib / MIB_PER_GIB } : {}),
    ...(r?.diskMib ? { diskGiB: r.diskMib / MIB_PER_GIB } : {}),
  };
}

export function specFromProto(s: SandboxSpec | undefined): RuntimeSandboxSpec {
  const r = s?.resources;
  if (!s?.id) throw errors.invalidArgument("spec.id is required");
  if (!r?.cpuMillicores || !r.memoryMib || !r.diskMib) throw errors.invalidArgument("spec.resources needs cpu_millicores, memory_mib and disk_mib");
  if (!s.user) throw errors.invalidArgument("spec.user is required");
  return {
    id: s.id,
    cpu: r.cpuMillicores / 1000,
    memoryGiB: r.memoryMib / MIB_PER_GIB,
    diskGiB: r.diskMib / MIB_PER_GIB,
    env: { ...s.env },
    user: s.user,
    volumes: s.volumes.map((v) => ({ volumeId: v.volumeId, mountPath: v.mountPath, ...(v.subpath ? { subpath: v.subpath } : {}) })),
    ...(s.snapshotRef ? { image: s.snapshotRef } : {}),
    ...(s.network ? { network: networkFromProto(s.network) } : {}),
    ...(s.layers.length ? { layers: [...s.layers] } : {}),
  };
}

const MODES: Record<RuntimeNetwork["mode"], NetworkMode> = { none: NetworkMode.NONE, full: NetworkMode.FULL, "allow-list": NetworkMode.ALLOW_LIST };

export function networkToProto(n: RuntimeNetwork): Network {
  return create(NetworkSchema, { mode: MODES[n.mode], allowCidrs: n.allowList });
}

export function networkFromProto(n: Network | undefined): RuntimeNetwork {
  const mode = (Object.keys(MODES) as RuntimeNetwork["mode"][]).find((m) => MODES[m] === n?.mode) ?? "none";
  return { mode, allowList: [...(n?.allowCidrs ?? [])] };
}

/** "created" (made, never started) travels as CREATING: the protocol has no state of its own for it. */
const STATES: Record<RuntimeState, SandboxState> = {
  created: SandboxState.CREATING,
  started: SandboxState.STARTED,
  stopped: SandboxState.STOPPED,
  paused: SandboxState.PAUSED,
  error: SandboxState.ERROR,
};

export function statusToProto(s: RuntimeSandbox): SandboxStatus {
  const h = s.health;
  return create(SandboxStatusSchema, {
    id: s.id,
    state: STATES[s.state],
    reason: s.error ?? "",
    ...(s.pausedMemory ? { pausedResidentBytes: BigInt(s.pausedMemory.residentBytes), pausedReclaimedBytes: BigInt(s.pausedMemory.reclaimedBytes ?? 0) } : {}),
    ...(h
      ? {
          health: {
            agentRunning: h.agentRunning,
            agentRestarts: h.agentRestarts,
            ...(h.lastAgentRestartAt ? { lastAgentRestartAt: timestampFromDate(h.lastAgentRestartAt) } : {}),
            oomKills: BigInt(h.oomKills),
            pidsLimitHits: BigInt(h.pidsLimitHits),
            memoryBytes: BigInt(h.memoryBytes),
            memoryLimitBytes: BigInt(h.memoryLimitBytes),
            pids: h.pids,
            pidsLimit: h.pidsLimit,
            pidsSaturated: h.pidsSaturated,
          },
        }
      : {}),
  });
}

export function statusFromProto(s: SandboxStatus): RuntimeSandbox {
  const state = (Object.keys(STATES) as RuntimeState[]).find((k) => STATES[k] === s.state);
  // A state this side does not know (a newer runner's) is an error with the runner's reason.
  const out: RuntimeSandbox = { id: s.id, state: state ?? "error", ...(s.reason || !state ? { error: s.reason || `the runner reports state ${SandboxState[s.state] ?? s.state}` } : {}) };
  if (out.state === "paused") {
    out.pausedMemory = { residentBytes: Number(s.pausedResidentBytes), ...(s.pausedReclaimedBytes > 0n ? { reclaimedBytes: Number(s.pausedReclaimedBytes) } : {}) };
  }
  const h = s.health;
  if (h) {
    out.health = {
      agentRunning: h.agentRunning,
      agentRestarts: h.agentRestarts,
      ...(h.lastAgentRestartAt ? { lastAgentRestartAt: timestampDate(h.lastAgentRestartAt) } : {}),
      oomKills: Number(h.oomKills),
      pidsLimitHits: Number(h.pidsLimitHits),
      memoryBytes: Number(h.memoryBytes),
      memoryLimitBytes: Number(h.memoryLimitBytes),
      pids: h.pids,
      pidsLimit: h.pidsLimit,
      pidsSaturated: h.pidsSaturated,
    };
  }
  return out;
}

const KINDS: readonly ChangeKind[] = ["added", "modified", "deleted"];
const TYPES: readonly ChangeType[] = ["file", "directory", "symlink", "other"];

export function changesPartToProto(p: ChangesPart): SandboxChangesPart {
  if (p.case === "data") return create(SandboxChangesPartSchema, { part: { case: "data", value: p.value } });
  const c = p.value;
  return create(SandboxChangesPartSchema, { part: { case: "change", value: { path: c.path, kind: c.kind, type: c.type, size: BigInt(c.size), mode: c.mode, mtime: timestampFromDate(c.mtime) } } });
}

export function changesPartFromProto(p: SandboxChangesPart): ChangesPart | undefined {
  if (p.part.case === "data") return { case: "data", value: p.part.value };
  if (p.part.case !== "change") return undefined;
  const c = p.part.value;
  const kind = KINDS.find((k) => k === c.kind);
  const type = TYPES.find((t) => t === c.type) ?? "other";
  if (!kind) throw errors.internal(`the runner sent a change of unknown kind ${JSON.stringify(c.kind)}`);
  return { case: "change", value: { path: c.path, kind, type, size: Number(c.size), mode: c.mode, mtime: c.mtime ? timestampDate(c.mtime) : new Date(0) } };
}
