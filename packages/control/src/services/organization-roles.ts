import { randomUUID } from "node:crypto";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { OrganizationRoleService } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { type Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import type { Credentials } from "../auth/credentials.ts";
import { scopeOf } from "../auth/scopes.ts";
import { execIn, pgArray } from "../db/exec.ts";
import { changeAccess } from "../organizations/access-changes.ts";
import { type RoleRow, rolesVisibleTo, toRole } from "../organizations/roles.ts";
import { Checks } from "./validate.ts";

// Roles of an organization (owner-only changes, declared on the RPCs). Global roles are listed
// with the organization's own and are not the organization's to change: they answer 404 here.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function organizationRoleService(orm: MikroORM, credentials: Credentials): Partial<ServiceImpl<typeof OrganizationRoleService>> {
  const notFound = (id: string) => errors.notFound(`Organization role with ID ${id} not found`);

  function checked(name: string, description: string, permissions: Permission[]): string[] {
    new Checks()
      .displayName("name", name)
      .displayName("description", description, 1024)
      .that(permissions.length > 0, "permissions should not be empty")
      .that(permissions.every((p) => p !== 0), "each value in permissions must be a valid permission")
      .done();
    return [...new Set(permissions.map(scopeOf))];
  }

  return {
    async listRoles(req) {
      return { items: (await rolesVisibleTo(execIn(orm.em.fork()), req.organizationId)).map(toRole) };
    },

    async createRole(req) {
      const permissions = checked(req.name, req.description, req.permissions);
      const rows = (await execIn(orm.em.fork())(
        `insert into organization_role (id, organization_id, name, description, permissions) values (?, ?, ?, ?, ?)
         returning id, name, description, permissions, is_global, created_at, updated_at`,
        [randomUUID(), req.organizationId, req.name.trim(), req.description.trim(), pgArray(permissions)],
      )) as RoleRow[];
      return toRole(rows[0]!);
    },

    async updateRole(req) {
      if (!UUID.test(req.roleId)) throw notFound(req.roleId);
      const permissions = checked(req.name, req.description, req.permissions);
      // Members holding the role gain or lose permissions: every process re-reads their access.
      const rows = await changeAccess(orm, credentials, [{ kind: "organization", organizationId: req.organizationId }], (exec) =>
        exec(
          `update organization_role set name = ?, description = ?, permissions = ? where id = ? and organization_id = ?
           returning id, name, description, permissions, is_global, created_at, updated_at`,
          [req.name.trim(), req.description.trim(), pgArray(permissions), req.roleId, req.organizationId],
        ),
      );
      const role = (rows as RoleRow[])[0];
      if (!role) throw notFound(req.roleId);
      return toRole(role);
    },

    async deleteRole(req) {
      if (!UUID.test(req.roleId)) throw notFound(req.roleId);
      await changeAccess(orm, credentials, [], async (exec) => {
        const found = (await exec(`select id from organization_role where id = ? and organization_id = ? for update`, [req.roleId, req.organizationId])) as unknown[];
        if (!found.length) throw notFound(req.roleId);
        // The reference fails with a 500 here (a foreign key); a role in use is refused instead.
        const [{ n }] = (await exec(
          `select (select count(*) from organization_member_role where role_id = ?) + (select count(*) from organization_invitation_role where role_id = ?) as n`,
          [req.roleId, req.roleId],
        )) as Array<{ n: string }>;
        if (Number(n) > 0) throw errors.failedPrecondition(`Organization role with ID ${req.roleId} is assigned to members or invitations: unassign it first`);
        await exec(`delete from organization_role where id = ?`, [req.roleId]);
      });
      return {};
    },
  };
}
