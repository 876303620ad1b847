import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { errors } from "@sandbar/protocol";
import { type OrganizationRole, OrganizationRoleSchema } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { permissionOf } from "../auth/scopes.ts";
import { dateOf, type Exec, pgArray } from "../db/exec.ts";

// Roles as rows and as the contract's OrganizationRole, and the role ids a request names.

export interface RoleRow {
  id: string;
  name: string;
  description: string;
  permissions: string[];
  is_global: boolean;
  created_at: Date | string;
  updated_at: Date | string;
}

const COLUMNS = `r.id, r.name, r.description, r.permissions, r.is_global, r.created_at, r.updated_at`;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function toRole(r: RoleRow): OrganizationRole {
  return create(OrganizationRoleSchema, {
    id: r.id,
    name: r.name,
    description: r.description,
    permissions: r.permissions.map((p) => permissionOf.get(p) ?? Permission.UNSPECIFIED).filter((p) => p !== Permission.UNSPECIFIED),
    isGlobal: r.is_global,
    createdAt: timestampFromDate(dateOf(r.created_at)),
    updatedAt: timestampFromDate(dateOf(r.updated_at)),
  });
}

/** The organization's own roles and the global ones, global first (the reference orders by id). */
export async function rolesVisibleTo(exec: Exec, organizationId: string): Promise<RoleRow[]> {
  return (await exec(`select ${COLUMNS} from organization_role r where r.organization_id = ? or r.is_global order by r.is_global desc, r.id`, [organizationId])) as RoleRow[];
}

/** The roles behind ids a request names: each must be the organization's own or global, else 400. */
export async function resolveRoles(exec: Exec, organizationId: string, ids: readonly string[]): Promise<RoleRow[]> {
  const unique = [...new Set(ids)];
  if (unique.some((id) => !UUID.test(id))) throw errors.invalidArgument("One or more role IDs are invalid");
  if (unique.length === 0) return [];
  const rows = (await exec(`select ${COLUMNS} from organization_role r where r.id = any(?::uuid[]) and (r.organization_id = ? or r.is_global)`, [
    pgArray(unique),
    organizationId,
  ])) as RoleRow[];
  if (rows.length !== unique.length) throw errors.invalidArgument("One or more role IDs are invalid");
  return rows;
}

/** Assigned roles of members (key `userId`) or invitations (key invitation id) of one organization. */
export async function assignedRoles(exec: Exec, kind: "member" | "invitation", organizationId: string): Promise<Map<string, RoleRow[]>> {
  const rows = (await (kind === "member"
    ? exec(`select m.user_id as owner_key, ${COLUMNS} from organization_member_role m join organization_role r on r.id = m.role_id where m.organization_id = ? order by r.id`, [organizationId])
    : exec(
        `select i.invitation_id::text as owner_key, ${COLUMNS} from organization_invitation_role i join organization_role r on r.id = i.role_id
          join organization_invitation v on v.id = i.invitation_id where v.organization_id = ? order by r.id`,
        [organizationId],
      ))) as Array<RoleRow & { owner_key: string }>;
  const byOwner = new Map<string, RoleRow[]>();
  for (const { owner_key, ...role } of rows) (byOwner.get(owner_key) ?? byOwner.set(owner_key, []).get(owner_key)!).push(role);
  return byOwner;
}

/** Scope strings a set of roles grants together. */
export function permissionsOf(roles: readonly RoleRow[]): Set<string> {
  return new Set(roles.flatMap((r) => r.permissions));
}
