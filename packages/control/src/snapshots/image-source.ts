import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { DOCKER_HUB, parseImageRef } from "@sandbar/runner/images";
import type { BuiltImages } from "../builds/built-images.ts";
import { execIn } from "../db/exec.ts";
import type { ImageSource } from "../sandboxes/manager.ts";
import type { CredentialsFor } from "./credentials-for.ts";

// Where a runner pulls a snapshot's image from: the snapshot's own image name pinned to the digest
// control pulled (a moved tag cannot give the runner other bytes), and the organization's
// credentials for the registry actually contacted, resolved as control's own pull resolves them
// (pulls.ts). A declarative build's image (a snapshot's or a sandbox's) comes from the internal
// registry, where its runner pushed it. Credentials are resolved per pull and never stored on the runner.

export function snapshotImageSource(orm: MikroORM, credentialsFor: CredentialsFor | undefined, mirror: string | undefined, built?: BuiltImages): ImageSource {
  return async (organizationId, digest) => {
    const exec = execIn(orm.em.fork());
    const rows = (await exec(
      `select image_name, build_info->>'snapshotRef' as build_ref from snapshot
        where ref = ? and (organization_id = ? or organization_id is null) and state = 'active'
        order by (build_info is null) desc, (organization_id is null) limit 1`,
      [digest, organizationId],
    )) as Array<{ image_name: string; build_ref: string | null }>;
    let row = rows[0];
    // A sandbox created with buildInfo has no snapshot of its image.
    row ??= ((await exec(`select '' as image_name, build_info->>'snapshotRef' as build_ref from sandbox where image_ref = ? and organization_id = ? and build_info is not null limit 1`, [digest, organizationId])) as Array<{ image_name: string; build_ref: string | null }>)[0];
    if (!row) {
      // A running sandbox's snapshot exported to the internal registry (sandboxes/snapshot-travel.ts): named there, pinned.
      const pushed = ((await exec(`select pushed_image from snapshot where organization_id = ? and pushed_image like ? and state = 'active' limit 1`, [organizationId, `%@${digest}`])) as Array<{ pushed_image: string }>)[0];
      if (pushed) {
        const registry = parseImageRef(pushed.pushed_image).registry;
        const credentials = credentialsFor ? await credentialsFor(organizationId, registry) : undefined;
        return { name: pushed.pushed_image, ...(credentials ? { credentials } : {}) };
      }
    }
    if (!row) throw errors.failedPrecondition(`No active snapshot of this organization has the image ${digest} any more: a runner has nowhere to pull it from`);
    let name = row.image_name;
    if (row.build_ref) {
      if (!built) throw errors.failedPrecondition(`The image ${digest} was built on one runner and this server has no internal registry to share it through (SANDBAR_INTERNAL_REGISTRY=off): run it where it was built`);
      name = built.name(organizationId, row.build_ref);
    }
    const ref = parseImageRef(name);
    const registry = ref.registry === DOCKER_HUB && mirror ? mirror : ref.registry;
    const credentials = credentialsFor ? await credentialsFor(organizationId, registry) : undefined;
    return { name: `${ref.registry}/${ref.repository}@${digest}`, ...(credentials ? { credentials } : {}) };
  };
}
