import { create, type DescEnum } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { enumValueJson } from "@sandbar/protocol";
import {
  BackupStateSchema,
  type Sandbox,
  GpuTypeSchema,
  SandboxClassSchema,
  SandboxDesiredStateSchema,
  type SandboxHealth,
  SandboxHealthSchema,
  SandboxSchema,
  SandboxStateSchema,
} from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { SandboxRecord } from "../db/entities.ts";
import { SANDBOX_CLASS } from "./list-query.ts";
import type { RuntimeHealth } from "./runtime.ts";
import { reportedState } from "./states.ts";

// A sandbox row as the reference's Sandbox DTO.

/** Enum number by JSON spelling, and back. */
export function enumCodec(desc: DescEnum) {
  const byName = new Map(desc.values.filter((v) => v.number !== 0).map((v) => [enumValueJson(v), v.number]));
  const byNumber = new Map([...byName].map(([name, n]) => [n, name]));
  return {
    number: (name: string) => byName.get(name) ?? 0,
    name: (n: number) => byNumber.get(n),
    names: [...byName.keys()],
  };
}

export const sandboxStates = enumCodec(SandboxStateSchema);
const desiredStates = enumCodec(SandboxDesiredStateSchema);
const backupStates = enumCodec(BackupStateSchema);
const classes = enumCodec(SandboxClassSchema);
const gpuTypeNumbers = enumCodec(GpuTypeSchema);

export interface DtoContext {
  /** `<publicUrl>/api/toolbox-proxy`: clients call `<it>/<sandboxId>/<agent path>`. */
  toolboxProxyUrl: string;
}

/** A running sandbox's live counters, as the contract's SandboxHealth. */
export function toHealth(h: RuntimeHealth): SandboxHealth {
  const { lastAgentRestartAt, oomKills, pidsLimitHits, memoryBytes, memoryLimitBytes, ...rest } = h;
  return create(SandboxHealthSchema, {
    ...rest,
    lastAgentRestartAt: lastAgentRestartAt ? timestampFromDate(lastAgentRestartAt) : undefined,
    oomKills: BigInt(oomKills),
    pidsLimitHits: BigInt(pidsLimitHits),
    memoryBytes: BigInt(memoryBytes),
    memoryLimitBytes: BigInt(memoryLimitBytes),
  });
}

export function toSandbox(r: SandboxRecord, c: DtoContext): Sandbox {
  return create(SandboxSchema, {
    id: r.id,
    organizationId: r.organizationId,
    name: r.name,
    snapshot: r.snapshot ?? undefined,
    user: r.osUser,
    env: r.env,
    labels: r.labels,
    public: r.public,
    networkBlockAll: r.networkBlockAll,
    networkAllowList: r.networkAllowList ?? undefined,
    target: r.regionId,
    cpu: r.cpu,
    gpu: r.gpu,
    ...(r.gpuType ? { gpuType: gpuTypeNumbers.number(r.gpuType) } : {}),
    memory: r.memory,
    disk: r.disk,
    state: sandboxStates.number(reportedState(r.state, r.desiredState)),
    desiredState: desiredStates.number(r.desiredState),
    errorReason: r.errorReason ?? undefined,
    // Only an `error` can be recovered from (a stale flag of an earlier error means nothing).
    recoverable: r.state === "error" && r.recoverable,
    autoDestroyAt: r.autoDestroyAt ? timestampFromDate(r.autoDestroyAt) : undefined,
    backupState: backupStates.number(r.backupState),
    backupCreatedAt: r.backupCreatedAt ? timestampFromDate(r.backupCreatedAt) : undefined,
    autoStopInterval: r.autoStopInterval,
    autoArchiveInterval: r.autoArchiveInterval,
    autoDeleteInterval: r.autoDeleteInterval,
    autoPauseInterval: r.autoPauseInterval,
    volumes: (r.volumes ?? []).map((v) => ({ volumeId: v.volumeId, mountPath: v.mountPath, subpath: v.subpath })),
    createdAt: timestampFromDate(r.createdAt),
    updatedAt: timestampFromDate(r.updatedAt),
    lastActivityAt: r.lastActivityAt ? timestampFromDate(r.lastActivityAt) : undefined,
    sandboxClass: classes.number(r.sandboxClass ?? SANDBOX_CLASS),
    runnerId: r.runnerId ?? undefined,
    warmPoolId: r.warmPoolId ?? undefined,
    toolboxProxyUrl: c.toolboxProxyUrl,
    buildInfo: r.buildInfo
      ? {
          dockerfileContent: r.buildInfo.dockerfileContent,
          contextHashes: r.buildInfo.contextHashes,
          snapshotRef: r.buildInfo.snapshotRef,
          createdAt: timestampFromDate(new Date(r.buildInfo.createdAt)),
          updatedAt: timestampFromDate(r.updatedAt),
        }
      : undefined,
  });
}
