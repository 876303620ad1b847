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
import { callerOf } from "../auth/principal.ts";
import { type SshKeyPair, sshKeyPair } from "../auth/ssh-key-pair.ts";
import { User } from "../db/entities.ts";
import { execIn } from "../db/exec.ts";
import { insertOrganization } from "../organizations/new-organization.ts";
import { applyQuota, checkQuota } from "../organizations/quota.ts";
import { Checks } from "./validate.ts";

// Users (spec 4.4): the caller's own account, and the operator's administration of users. Each
// user gets a personal organization it owns, made in the same transaction. The SSH key pair's
// private half is answered once (create, regenerate) and never stored.

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;
const USER_ID = /^[A-Za-z0-9._|@:-]{1,255}$/;

export function userService(orm: MikroORM): Partial<ServiceImpl<typeof UserService>> {
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
