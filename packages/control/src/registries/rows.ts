import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type DockerRegistry, DockerRegistrySchema, RegistryType } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import { dateOf } from "../db/exec.ts";

/** A docker_registry row as the connection answers it. */
export interface RegistryRow {
  id: string;
  organization_id: string | null;
  name: string;
  url: string;
  username: string;
  password_sealed: string;
  project: string;
  registry_type: string;
  is_default: boolean;
  created_at: Date | string;
  updated_at: Date | string;
}

/** Every column but the sealed password, for answers. */
export const PUBLIC_COLUMNS = `id, organization_id, name, url, username, project, registry_type, is_default, created_at, updated_at`;

const TYPES: Record<string, RegistryType> = {
  internal: RegistryType.INTERNAL,
  organization: RegistryType.ORGANIZATION,
  transient: RegistryType.TRANSIENT,
  backup: RegistryType.BACKUP,
};

/** The answer: the reference's DTO fields plus is_default; the password never leaves the row. */
export function toDockerRegistry(r: Omit<RegistryRow, "password_sealed">): DockerRegistry {
  return create(DockerRegistrySchema, {
    id: r.id,
    name: r.name,
    url: r.url,
    username: r.username,
    project: r.project,
    registryType: TYPES[r.registry_type] ?? RegistryType.UNSPECIFIED,
    createdAt: timestampFromDate(dateOf(r.created_at)),
    updatedAt: timestampFromDate(dateOf(r.updated_at)),
    isDefault: r.is_default,
  });
}
