import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import {
  SystemRole,
  type User as UserDto,
  type UserAccount,
  UserAccountSchema,
  UserKeyPairSchema,
  UserSchema,
  UserService,
} from "@sandbar/protocol/gen/sandbar/control/v1/user_pb.js";
import type { Credentials } from "../auth/credentials.ts";
import { callerOf } from "../call/call.ts";
import { ADMIN_USER_ID } from "../bootstrap.ts";
import { type SshKeyPair, sshKeyPair } from "../auth/ssh-key-pair.ts";
import { User } from "../db/entities.ts";
import { execIn } from "../db/exec.ts";
import { changeAccess, deleteKeys, lockOwners } from "../organizations/access-changes.ts";
import { insertOrganization } from "../organizations/new-organization.ts";
import { removeOrganization } from "../organizations/remove-organization.ts";
import { recordEvent } from "../webhooks/events.ts";
import { applyQuota, checkQuota } from "../organizations/quota.ts";
import { Checks } from "./validate.ts";

// Users (spec 4.4): the caller's own account, and the operator's administration of users. Each
// user gets a personal organization it owns, made in the same transaction. The SSH key pair's
// private half is answered once (create, regenerate) and never stored. Deleting a user removes
// their personal organization and memberships (refused while they are the last owner of another
// organization, as the reference refuses) and remembers the subject, so their tokens, of the
// built-in issuer or an external one, are refused instead of provisioning them again.

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;
const USER_ID = /^[A-Za-z0-9._|@:-]{1,255}$/;

export function userService(orm: MikroORM, credentials: Credentials): Partial<ServiceImpl<typeof UserService>> {
  const em = () => orm.em.fork();

  async function find(id: string): Promise<User> {
    const user = await em().findOne(User, { id });
    if (!user) throw errors.notFound(`User with ID ${id} not found`);
    return user;
  }

  return {
    async getAuthenticatedUser(_req, ctx) {
      return toUser(await find(callerOf(ctx).userId));
    },

    async createUser(req) {
      new Checks()
        .that(USER_ID.test(req.id), "id must be 1 to 255 letters, digits or ._|@:- characters")
        .displayName("name", req.name)
        .that(!req.email || EMAIL.test(req.email), "email must be an email")
        .done();
      const { $typeName: _t, $unknown: _u, ...quota } = req.personalOrganizationQuota ?? {};
      checkQuota(quota);
      const keys = await sshKeyPair();
      const user = await em().transactional(async (tx) => {
        if (await tx.findOne(User, { id: req.id })) throw errors.alreadyExists(`User with ID ${req.id} already exists`);
        const now = new Date();
        const row = tx.create(User, {
          id: req.id,
          name: req.name,
          email: req.email ?? "",
          role: req.role === SystemRole.ADMIN ? "admin" : "user",
          emailVerified: req.emailVerified ?? false,
          sshPublicKey: keys.publicKey,
          createdAt: now,
        });
        await tx.flush();
        // The user's own organization, as the reference makes it with every user.
        const organizationId = await insertOrganization(execIn(tx), { name: "Personal", createdBy: row.id, personal: true, defaultRegionId: req.personalOrganizationDefaultRegionId });
        await applyQuota(execIn(tx), organizationId, quota);
        return row;
      });
      return toAccount(user, keys);
    },

    async listUsers() {
      const rows = await em().find(User, {}, { orderBy: { createdAt: "asc" } });
      return { items: rows.map(toUser) };
    },

    async getUser(req) {
      return toUser(await find(req.id));
    },

    async regenerateKeyPair(req) {
      const fork = em();
      const user = await fork.findOne(User, { id: req.id });
      if (!user) throw errors.notFound(`User with ID ${req.id} not found`);
      const keys = await sshKeyPair();
      user.sshPublicKey = keys.publicKey;
      await fork.flush();
      return toAccount(user, keys);
    },

    async deleteUser(req, ctx) {
      const { id } = req;
      if (!USER_ID.test(id)) throw errors.notFound(`User with ID ${id} not found`);
      const caller = callerOf(ctx);
      if (id === caller.userId) throw errors.permissionDenied("You cannot delete your own user");
      // The operator's own account: the next start would make it (and a second default organization) again.
      if (id === ADMIN_USER_ID) throw errors.permissionDenied(`The bootstrap admin ${ADMIN_USER_ID} cannot be deleted`);
      await changeAccess(orm, credentials, [{ kind: "user", userId: id }], async (exec, changes) => {
        // The lock a first sign-in takes (auth/jwt-users.ts): no provisioning interleaves.
        await exec(`select pg_advisory_xact_lock(hashtext(?))`, [id]);
        const found = (await exec(`select id from "user" where id = ? for update`, [id])) as Array<{ id: string }>;
        if (!found[0]) throw errors.notFound(`User with ID ${id} not found`);
        const memberships = (await exec(
          `select m.organization_id, m.role, o.name, (o.personal and o.created_by = m.user_id) as own_personal
             from organization_member m join organization o on o.id = m.organization_id
            where m.user_id = ? order by o.created_at, o.id`,
          [id],
        )) as Array<{ organization_id: string; role: string; name: string; own_personal: boolean }>;
        const others = memberships.filter((m) => !m.own_personal);
        const lastOwner: string[] = [];
        for (const m of others) {
          if (m.role !== "owner") continue;
          const owners = await lockOwners(exec, m.organization_id);
          if (owners.length === 1) lastOwner.push(`${m.name} (${m.organization_id})`);
        }
        if (lastOwner.length > 0) {
          throw errors.failedPrecondition(
            `User ${id} is the last owner of ${lastOwner.length === 1 ? "organization" : "organizations"} ${lastOwner.join(", ")}: make another member an owner or delete ${lastOwner.length === 1 ? "it" : "them"} first`,
          );
        }
        const personal = (await exec(`select id from organization where personal and created_by = ?`, [id])) as Array<{ id: string }>;
        for (const p of personal) await removeOrganization(exec, changes, p.id, `The personal organization ${p.id} of user ${id}`);
        for (const m of others) {
          await exec(`delete from organization_member where organization_id = ? and user_id = ?`, [m.organization_id, id]);
          await recordEvent(exec, m.organization_id, "organization.member.removed", { organizationId: m.organization_id, userId: id });
        }
        await deleteKeys(exec, changes, "user_id = ?", [id]);
        // The built-in issuer's state for them: sessions, grants, and the codes and refresh tokens of those grants.
        await exec(
          `delete from oidc_payload
            where payload->>'accountId' = ?
               or grant_id in (select g.id from oidc_payload g where g.kind = 'Grant' and g.payload->>'accountId' = ?)`,
          [id, id],
        );
        // The subject is remembered (tokens issued before now are refused everywhere), then the row
        // goes with its password and sign-in addresses.
        await exec(
          `insert into deleted_user (id, deleted_at, deleted_by) values (?, now(), ?)
           on conflict (id) do update set deleted_at = excluded.deleted_at, deleted_by = excluded.deleted_by`,
          [id, caller.userId],
        );
        await exec(`delete from "user" where id = ?`, [id]);
      });
      return {};
    },

    // Linking sign-in accounts needs an identity provider with a management API (the reference
    // uses Auth0's); neither the built-in issuer nor a plain OpenID issuer has one, so these
    // answer as the reference does with its management API off.
    async listAccountProviders() {
      throw errors.notFound("Account linking is not available: the identity provider has no management API");
    },
    async linkAccount() {
      throw errors.notFound("Account linking is not available: the identity provider has no management API");
    },
    async unlinkAccount() {
      throw errors.notFound("Account linking is not available: the identity provider has no management API");
    },
  };
}

function toUser(u: User): UserDto {
  return create(UserSchema, { id: u.id, name: u.name, email: u.email, publicKeys: [], createdAt: timestampFromDate(u.createdAt) });
}

function toAccount(u: User, keys: SshKeyPair): UserAccount {
  return create(UserAccountSchema, {
    id: u.id,
    name: u.name,
    email: u.email,
    publicKeys: [],
    createdAt: timestampFromDate(u.createdAt),
    role: u.role === "admin" ? SystemRole.ADMIN : SystemRole.USER,
    emailVerified: u.emailVerified,
    keyPair: create(UserKeyPairSchema, keys),
  });
}
