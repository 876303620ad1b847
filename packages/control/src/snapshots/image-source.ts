import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { DOCKER_HUB, parseImageRef } from "@sandbar/runner/images";
import { execIn } from "../db/exec.ts";
import type { ImageSource } from "../sandboxes/manager.ts";
import type { CredentialsFor } from "./pulls.ts";

// Where a runner pulls a snapshot's image from: the snapshot's own image name pinned to the digest
// control pulled (a moved tag cannot give the runner other bytes), and the organization's
// credentials for the registry actually contacted, resolved as control's own pull resolves them
// (pulls.ts). Credentials are resolved per pull and never stored on the runner.

export function snapshotImageSource(orm: MikroORM, credentialsFor: CredentialsFor | undefined, mirror: string | undefined): ImageSource {
  return async (organizationId, digest) => {
    const rows = (await execIn(orm.em.fork())(
      `select image_name, build_info is not null as built from snapshot
        where ref = ? and (organization_id = ? or organization_id is null) and state = 'active'
        order by (build_info is null) desc, (organization_id is null) limit 1`,
      [digest, organizationId],
    )) as Array<{ image_name: string; built: boolean }>;
    const row = rows[0];
    if (!row) throw errors.failedPrecondition(`No active snapshot of this organization has the image ${digest} any more: a runner has nowhere to pull it from`);
    if (row.built) throw errors.failedPrecondition(`The image ${digest} was built on control's host and is in no registry a runner can pull from: run it in a region without registered runners`);
    const ref = parseImageRef(row.image_name);
    const registry = ref.registry === DOCKER_HUB && mirror ? mirror : ref.registry;
    const credentials = credentialsFor ? await credentialsFor(organizationId, registry) : undefined;
    return { name: `${ref.registry}/${ref.repository}@${digest}`, ...(credentials ? { credentials } : {}) };
  };
}
