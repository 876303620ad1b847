import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { SandboxVolume } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { SandboxVolumeMount } from "../db/entities.ts";
import { checkMounts } from "./mount-paths.ts";
import { VolumeStore } from "./store.ts";

// The `volumes` of a sandbox create: mount paths checked, each reference (a volume id or name)
// resolved to one ready volume of the organization, with the reference's messages.

export async function resolveMounts(orm: MikroORM, organizationId: string, requested: SandboxVolume[]): Promise<SandboxVolumeMount[]> {
  if (!requested.length) return [];
  const checks = checkMounts(requested);
  for (const v of requested) checks.that(v.volumeId.trim() !== "", "volumeId should not be empty");
  checks.done();
  const store = new VolumeStore(orm);
  const mounts: SandboxVolumeMount[] = [];
  for (const v of requested) {
    const ref = v.volumeId.trim();
    const found = await store.candidates(organizationId, ref);
    const byId = found.find((r) => r.id === ref);
    const byName = found.find((r) => r.name === ref);
    if (byId && byName && byId.id !== byName.id) {
      throw errors.invalidArgument(`Volume reference '${ref}' matches one volume's ID and another volume's name; rename the volume to remove the ambiguity`);
    }
    const volume = byId ?? byName;
    if (!volume) throw errors.notFound(`Volume '${ref}' not found`);
    if (volume.state !== "ready") throw errors.invalidArgument(`Volume '${volume.name}' is not in a ready state. Current state: ${volume.state}`);
    mounts.push({ volumeId: volume.id, mountPath: v.mountPath.replace(/(.)\/+$/, "$1"), ...(v.subpath ? { subpath: v.subpath } : {}) });
  }
  await store.touch([...new Set(mounts.map((m) => m.volumeId))], new Date());
  return mounts;
}
