import type { InternalRegistry } from "../registries/internal/index.ts";
import { namespaceOf } from "../registries/internal/index.ts";
import type { RegistryCredentials } from "@sandbar/runner/images";
import type { PushTarget } from "./builder.ts";

// Where built images live beyond the runner that built them: the internal registry (the
// reference's "transient registry"), in the organization's namespace under the build's own ref
// (`<registry>/<organization id>/daytona-<sha256>:daytona`). The building runner pushes there
// with a pull-and-push account of the organization given for that build; other runners pull the
// image pinned to its digest with the organization's pull-only account (image-source.ts).

export interface BuiltImages {
  /** The repository and tag a build of the organization is pushed to. */
  name(organizationId: string, snapshotRef: string): string;
  push: PushTarget;
  /** Where a running sandbox's snapshot is exported to (its own repository), with credentials that may push there. */
  snapshot(organizationId: string, snapshotId: string): Promise<{ image: string; credentials: RegistryCredentials }>;
}

export function builtImagesIn(registry: InternalRegistry): BuiltImages {
  const name = (organizationId: string, snapshotRef: string) => `${registry.host}/${namespaceOf(organizationId)}/${snapshotRef}`;
  return {
    name,
    push: async (organizationId, info) => ({ image: name(organizationId, info.snapshotRef), credentials: await registry.buildCredentials(organizationId) }),
    snapshot: async (organizationId, snapshotId) => ({ image: name(organizationId, `sandbar-snapshot-${snapshotId}:snapshot`), credentials: await registry.buildCredentials(organizationId) }),
  };
}
