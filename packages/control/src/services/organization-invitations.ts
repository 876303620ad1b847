import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import {
  InvitationStatus,
  type OrganizationInvitation,
  OrganizationInvitationSchema,
  type OrganizationInvitationService,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import type { Credentials } from "../auth/credentials.ts";
import { callerOf } from "../call/call.ts";
import { dateOf, type Exec, execIn } from "../db/exec.ts";
import { changeAccess } from "../organizations/access-changes.ts";
import { assignedRoles, resolveRoles, toRole } from "../organizations/roles.ts";
import { memberRoleOf, requiredRole } from "./organization-members.ts";
import { Checks } from "./validate.ts";
import { recordEvent } from "../webhooks/events.ts";

// Invitations: made, changed and cancelled by an organization's owners; listed, accepted and
// declined by the person whose (verified) e-mail they name. Only a pending invitation before its
// expiry moves, and only once; "expired" is derived from expiresAt, never stored.

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const WEEK_MS = 7 * 24 * 3600 * 1000;

interface InvitationRow {
  id: string;
  organization_id: string;
  organization_name: string;
  email: string;
  invited_by: string;
  role: string;
  status: string;
  expires_at: Date | string;
  created_at: Date | string;
  updated_at: Date | string;
}

const STATUS: Record<string, InvitationStatus> = {
  pending: InvitationStatus.PENDING,
  accepted: InvitationStatus.ACCEPTED,
  declined: InvitationStatus.DECLINED,
  cancelled: InvitationStatus.CANCELLED,
};

const SELECT = `select i.id, i.organization_id, o.name as organization_name, i.email, i.invited_by, i.role, i.status, i.expires_at, i.created_at, i.updated_at
                  from organization_invitation i join organization o on o.id = i.organization_id`;

export function organizationInvitationService(orm: MikroORM, credentials: Credentials): Partial<ServiceImpl<typeof OrganizationInvitationService>> {
  const exec0 = () => execIn(orm.em.fork());

  async function toInvitations(exec: Exec, rows: InvitationRow[]): Promise<OrganizationInvitation[]> {
    const roles = new Map<string, Awaited<ReturnType<typeof assignedRoles>>>();
    for (const org of new Set(rows.map((r) => r.organization_id))) roles.set(org, await assignedRoles(exec, "invitation", org));
    return rows.map((r) =>
      create(OrganizationInvitationSchema, {
        id: r.id,
        email: r.email,
        invitedBy: r.invited_by,
        organizationId: r.organization_id,
        organizationName: r.organization_name,
        expiresAt: timestampFromDate(dateOf(r.expires_at)),
        status: STATUS[r.status] ?? InvitationStatus.UNSPECIFIED,
        role: memberRoleOf(r.role),
        assignedRoles: (roles.get(r.organization_id)?.get(r.id) ?? []).map(toRole),
        createdAt: timestampFromDate(dateOf(r.created_at)),
        updatedAt: timestampFromDate(dateOf(r.updated_at)),
      }),
    );
  }

  /** A future expiry from the request, or the default a week ahead. */
  function expiryOf(t: Timestamp | undefined, fallback: Date | undefined): Date {
    if (!t) return fallback ?? new Date(Date.now() + WEEK_MS);
    const d = timestampDate(t);
    new Checks().that(!Number.isNaN(d.getTime()), "expiresAt must be a Date instance").that(d.getTime() > Date.now(), "expiresAt must be in the future").done();
    return d;
  }

  /** Locks a pending, unexpired invitation of the organization for a change by its owners. */
  async function movable(exec: Exec, organizationId: string, id: string): Promise<InvitationRow> {
    const rows = UUID.test(id) ? ((await exec(`${SELECT} where i.id = ? and i.organization_id = ? for update of i`, [id, organizationId])) as InvitationRow[]) : [];
    const row = rows[0];
    if (!row) throw errors.notFound(`Invitation with ID ${id} not found`);
    return stillOpen(row);
  }

  function stillOpen(row: InvitationRow): InvitationRow {
    if (row.status !== "pending") throw errors.permissionDenied(`Invitation with ID ${row.id} is already ${row.status}`);
    if (dateOf(row.expires_at).getTime() <= Date.now()) throw errors.permissionDenied(`Invitation with ID ${row.id} is expired`);
    return row;
  }

  /** The caller's own invitation: one addressed to another e-mail does not exist for them. */
  async function mine(exec: Exec, ctx: HandlerContext, id: string): Promise<InvitationRow> {
    const caller = callerOf(ctx);
    const users = (await exec(`select email, email_verified from "user" where id = ?`, [caller.userId])) as Array<{ email: string; email_verified: boolean }>;
    const email = users[0]?.email.trim().toLowerCase() ?? "";
    const rows = UUID.test(id) && email ? ((await exec(`${SELECT} where i.id = ? and i.email = ? for update of i`, [id, email])) as InvitationRow[]) : [];
    if (!rows[0]) throw errors.notFound(`Organization invitation with ID ${id} not found`);
    // The e-mail is what proves the invitation is theirs: it must be one their issuer verified.
    if (!users[0]!.email_verified) throw errors.permissionDenied("Please verify your email address");
    return stillOpen(rows[0]);
  }

  async function myEmail(ctx: HandlerContext): Promise<string> {
    const rows = (await exec0()(`select email from "user" where id = ?`, [callerOf(ctx).userId])) as Array<{ email: string }>;
    return rows[0]?.email.trim().toLowerCase() ?? "";
  }

  return {
    async listMyInvitations(_req, ctx) {
      const exec = exec0();
      const rows = (await exec(`${SELECT} where i.email = ? and i.status = 'pending' and i.expires_at > now() order by i.created_at`, [await myEmail(ctx)])) as InvitationRow[];
      return { items: await toInvitations(exec, rows) };
    },

    async countMyInvitations(_req, ctx) {
      const rows = (await exec0()(`select count(*)::int as n from organization_invitation where email = ? and status = 'pending' and expires_at > now()`, [await myEmail(ctx)])) as Array<{
        n: number;
      }>;
      return { count: rows[0]?.n ?? 0 };
    },

    async acceptInvitation(req, ctx) {
      const caller = callerOf(ctx);
      const row = await changeAccess(orm, credentials, [], async (exec, changes) => {
        const inv = await mine(exec, ctx, req.invitationId);
        const member = (await exec(`select 1 from organization_member where organization_id = ? and user_id = ?`, [inv.organization_id, caller.userId])) as unknown[];
        if (member.length) throw errors.alreadyExists("You are already a member of this organization");
        await exec(`insert into organization_member (organization_id, user_id, role) values (?, ?, ?)`, [inv.organization_id, caller.userId, inv.role]);
        await exec(
          `insert into organization_member_role (organization_id, user_id, role_id)
           select ?, ?, role_id from organization_invitation_role where invitation_id = ?`,
          [inv.organization_id, caller.userId, inv.id],
        );
        await exec(`update organization_invitation set status = 'accepted' where id = ?`, [inv.id]);
        const assigned = (await exec(`select role_id from organization_invitation_role where invitation_id = ? order by role_id`, [inv.id])) as Array<{ role_id: string }>;
        await recordEvent(exec, inv.organization_id, "organization.member.added", {
          organizationId: inv.organization_id,
          userId: caller.userId,
          role: inv.role,
          assignedRoleIds: assigned.map((r) => r.role_id),
        });
        changes.push({ kind: "member", organizationId: inv.organization_id, userId: caller.userId });
        return { ...inv, status: "accepted" };
      });
      return (await toInvitations(exec0(), [row]))[0]!;
    },

    async declineInvitation(req, ctx) {
      await changeAccess(orm, credentials, [], async (exec) => {
        const inv = await mine(exec, ctx, req.invitationId);
        await exec(`update organization_invitation set status = 'declined' where id = ?`, [inv.id]);
      });
      return {};
    },

    async listInvitations(req) {
      const exec = exec0();
      const rows = (await exec(`${SELECT} where i.organization_id = ? and i.status = 'pending' and i.expires_at > now() order by i.created_at`, [req.organizationId])) as InvitationRow[];
      return { items: await toInvitations(exec, rows) };
    },

    async createInvitation(req, ctx) {
      const email = req.email.trim().toLowerCase();
      new Checks().that(EMAIL.test(email) && email.length <= 255, "email must be an email").done();
      const role = requiredRole(req.role);
      const expiresAt = expiryOf(req.expiresAt, undefined);
      const caller = callerOf(ctx);
      const id = randomUUID();
      await changeAccess(orm, credentials, [], async (exec) => {
        const orgs = (await exec(`select personal from organization where id = ? for update`, [req.organizationId])) as Array<{ personal: boolean }>;
        if (orgs[0]?.personal) throw errors.permissionDenied("Cannot invite users to personal organization");
        const roles = await resolveRoles(exec, req.organizationId, req.assignedRoleIds);
        const members = (await exec(`select 1 from organization_member m join "user" u on u.id = m.user_id where m.organization_id = ? and lower(u.email) = ?`, [
          req.organizationId,
          email,
        ])) as unknown[];
        if (members.length) throw errors.alreadyExists(`User with email ${email} is already associated with this organization`);
        const open = (await exec(`select 1 from organization_invitation where organization_id = ? and email = ? and status = 'pending' and expires_at > now()`, [
          req.organizationId,
          email,
        ])) as unknown[];
        if (open.length) throw errors.alreadyExists(`User with email "${email}" already invited to this organization`);
        await exec(`insert into organization_invitation (id, organization_id, email, invited_by, role, expires_at) values (?, ?, ?, ?, ?, ?)`, [
          id,
          req.organizationId,
          email,
          caller.email || caller.userId,
          role,
          expiresAt,
        ]);
        for (const r of roles) await exec(`insert into organization_invitation_role (invitation_id, role_id) values (?, ?)`, [id, r.id]);
      });
      const exec = exec0();
      return (await toInvitations(exec, (await exec(`${SELECT} where i.id = ?`, [id])) as InvitationRow[]))[0]!;
    },

    async updateInvitation(req) {
      const role = requiredRole(req.role);
      await changeAccess(orm, credentials, [], async (exec) => {
        const inv = await movable(exec, req.organizationId, req.invitationId);
        const roles = await resolveRoles(exec, req.organizationId, req.assignedRoleIds);
        await exec(`update organization_invitation set role = ?, expires_at = ? where id = ?`, [role, expiryOf(req.expiresAt, dateOf(inv.expires_at)), inv.id]);
        await exec(`delete from organization_invitation_role where invitation_id = ?`, [inv.id]);
        for (const r of roles) await exec(`insert into organization_invitation_role (invitation_id, role_id) values (?, ?)`, [inv.id, r.id]);
      });
      const exec = exec0();
      return (await toInvitations(exec, (await exec(`${SELECT} where i.id = ?`, [req.invitationId])) as InvitationRow[]))[0]!;
    },

    async cancelInvitation(req) {
      await changeAccess(orm, credentials, [], async (exec) => {
        const inv = await movable(exec, req.organizationId, req.invitationId);
        await exec(`update organization_invitation set status = 'cancelled' where id = ?`, [inv.id]);
      });
      return {};
    },
  };
}
