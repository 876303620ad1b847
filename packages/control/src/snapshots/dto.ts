import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { BuildInfoSchema } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { type Snapshot, SnapshotSchema, SnapshotStateSchema } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import { enumCodec } from "../sandboxes/dto.ts";
import type { SnapshotRow } from "./store.ts";

// A snapshot row as the reference's SnapshotDto (`mem`, not `memory`), with the earlier set's `enabled`.

const states = enumCodec(SnapshotStateSchema);

export function toSnapshot(r: SnapshotRow): Snapshot {
  return create(SnapshotSchema, {
    id: r.id,
    organizationId: r.general ? undefined : (r.organizationId ?? undefined),
    general: r.general,
    name: r.name,
    imageName: r.imageName,
    state: states.number(r.state),
    size: r.size ?? undefined,
    entrypoint: r.entrypoint,
    cpu: r.cpu,
    gpu: r.gpu,
    mem: r.mem,
    disk: r.disk,
    errorReason: r.errorReason ?? undefined,
    createdAt: timestampFromDate(r.createdAt),
    updatedAt: timestampFromDate(r.updatedAt),
    lastUsedAt: r.lastUsedAt ? timestampFromDate(r.lastUsedAt) : undefined,
    ref: r.ref ?? undefined,
    enabled: r.state !== "inactive",
    buildInfo: r.buildInfo
      ? create(BuildInfoSchema, {
          dockerfileContent: r.buildInfo.dockerfileContent,
          contextHashes: r.buildInfo.contextHashes,
          snapshotRef: r.buildInfo.snapshotRef,
          createdAt: timestampFromDate(new Date(r.buildInfo.createdAt)),
          updatedAt: timestampFromDate(r.updatedAt),
        })
      : undefined,
  });
}
