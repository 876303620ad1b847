import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import {
  OrganizationMemberRole,
  type OrganizationMemberService,
  type OrganizationUser,
  OrganizationUserSchema,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import type { Credentials, Invalidation } from "../auth/credentials.ts";
import { callerOf } from "../call/call.ts";
import { ALL_SCOPES } from "../auth/scopes.ts";
import { dateOf, type Exec, execIn, pgArray } from "../db/exec.ts";
import { changeAccess, deleteKeys, lockOwners } from "../organizations/access-changes.ts";
import { assignedRoles, permissionsOf, resolveRoles, type RoleRow, toRole } from "../organizations/roles.ts";
import { recordEvent } from "../webhooks/events.ts";

// Members of an organization and their access: the member role (owner or member) and assigned
// roles. An organization always keeps an owner; a member whose permissions shrink loses the API
// keys that used what was taken away (keys are not re-checked against roles on each call).

interface MemberRow {
  user_id: string;
  organization_id: string;
  role: string;
  name: string | null;
  email: string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

const memberRoleName = (r: OrganizationMemberRole) => (r === OrganizationMemberRole.OWNER ? "owner" : r === OrganizationMemberRole.MEMBER ? "member" : undefined);
export const memberRoleOf = (r: string) => (r === "owner" ? OrganizationMemberRole.OWNER : OrganizationMemberRole.MEMBER);

/** 400 unless the request names a member role. */
export function requiredRole(r: OrganizationMemberRole): string {
  const name = memberRoleName(r);
  if (!name) throw errors.invalidArgument("role must be one of the following values: owner, member");
  return name;
}

export function organizationMemberService(orm: MikroORM, credentials: Credentials): Partial<ServiceImpl<typeof OrganizationMemberService>> {
  async function members(exec: Exec, organizationId: string, userId?: string): Promise<OrganizationUser[]> {
    const rows = (await exec(
      `select m.user_id, m.organization_id, m.role, u.name, u.email, m.created_at, m.updated_at
         from organization_member m left join "user" u on u.id = m.user_id
        where m.organization_id = ? ${userId === undefined ? "" : "and m.user_id = ?"} order by m.created_at, m.user_id`,
      userId === undefined ? [organizationId] : [organizationId, userId],
    )) as MemberRow[];
    const roles = await assignedRoles(exec, "member", organizationId);
    return rows.map((m) =>
      create(OrganizationUserSchema, {
        userId: m.user_id,
        organizationId: m.organization_id,
        name: m.name ?? "",
        email: m.email ?? "",
        role: memberRoleOf(m.role),
        assignedRoles: (roles.get(m.user_id) ?? []).map(toRole),
        createdAt: timestampFromDate(dateOf(m.created_at)),
        updatedAt: timestampFromDate(dateOf(m.updated_at)),
      }),
    );
  }

  /**
   * Sets a member's role and/or assigned roles (undefined: unchanged), in one transaction with
   * the last-owner rule, the revocation of keys using permissions the member loses, and the
   * notice to every process.
   */
  async function setAccess(ctx: HandlerContext, organizationId: string, userId: string, role: string | undefined, roleIds: readonly string[] | undefined) {
    if (callerOf(ctx).userId === userId) throw errors.permissionDenied("You cannot update your own access");
    const changes: Invalidation[] = [{ kind: "member", organizationId, userId }];
    await changeAccess(orm, credentials, changes, async (exec) => {
      const owners = await lockOwners(exec, organizationId);
      const current = (await exec(`select role from organization_member where organization_id = ? and user_id = ? for update`, [organizationId, userId])) as Array<{ role: string }>;
      if (!current[0]) throw errors.notFound(`User with ID ${userId} not found in organization with ID ${organizationId}`);
      const held = (await assignedRoles(exec, "member", organizationId)).get(userId) ?? [];
      const nextRole = role ?? current[0].role;
      const nextRoles: RoleRow[] = roleIds === undefined ? held : await resolveRoles(exec, organizationId, roleIds);
      if (current[0].role === "owner" && nextRole !== "owner" && owners.length === 1) throw errors.permissionDenied("The organization must have at least one owner");

      const before = current[0].role === "owner" ? new Set(ALL_SCOPES) : permissionsOf(held);
      const after = nextRole === "owner" ? new Set(ALL_SCOPES) : permissionsOf(nextRoles);
      const lost = [...before].filter((p) => !after.has(p));
      if (lost.length) await deleteKeys(exec, changes, `organization_id = ? and user_id = ? and permissions && ?::text[]`, [organizationId, userId, pgArray(lost)]);

      await exec(`update organization_member set role = ?, updated_at = now() where organization_id = ? and user_id = ?`, [nextRole, organizationId, userId]);
      if (roleIds !== undefined) {
        await exec(`delete from organization_member_role where organization_id = ? and user_id = ?`, [organizationId, userId]);
        for (const r of nextRoles) await exec(`insert into organization_member_role (organization_id, user_id, role_id) values (?, ?, ?)`, [organizationId, userId, r.id]);
      }
      await recordEvent(exec, organizationId, "organization.member.updated", { organizationId, userId, role: nextRole, assignedRoleIds: nextRoles.map((r) => r.id) });
    });
    return (await members(execIn(orm.em.fork()), organizationId, userId))[0]!;
  }

  return {
    async listMembers(req) {
      return { items: await members(execIn(orm.em.fork()), req.organizationId) };
    },

    updateMemberAccess(req, ctx) {
      return setAccess(ctx, req.organizationId, req.userId, requiredRole(req.role), req.assignedRoleIds);
    },

    updateMemberRole(req, ctx) {
      return setAccess(ctx, req.organizationId, req.userId, requiredRole(req.role), undefined);
    },

    updateAssignedRoles(req, ctx) {
      return setAccess(ctx, req.organizationId, req.userId, undefined, req.assignedRoleIds);
    },

    async removeMember(req) {
      const { organizationId, userId } = req;
      await changeAccess(orm, credentials, [{ kind: "member", organizationId, userId }], async (exec, changes) => {
        const owners = await lockOwners(exec, organizationId);
        const found = (await exec(`select role from organization_member where organization_id = ? and user_id = ?`, [organizationId, userId])) as Array<{ role: string }>;
        if (!found[0]) throw errors.notFound(`User with ID ${userId} not found in organization with ID ${organizationId}`);
        if (found[0].role === "owner" && owners.length === 1) throw errors.permissionDenied(`Organization with ID ${organizationId} must have at least one owner`);
        await deleteKeys(exec, changes, "organization_id = ? and user_id = ?", [organizationId, userId]);
        await exec(`delete from organization_member where organization_id = ? and user_id = ?`, [organizationId, userId]);
        await recordEvent(exec, organizationId, "organization.member.removed", { organizationId, userId });
      });
      return {};
    },
  };
}
