import { randomUUID } from "node:crypto";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import type { ApiKey } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import type { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { Credentials } from "../auth/credentials.ts";
import { generateApiKey, hashApiKey, keyEnds, maskApiKey } from "../auth/key-material.ts";
import { authOf, callerOf, organizationOf } from "../call/call.ts";
import { permissionOf, scopeOf } from "../auth/scopes.ts";
import { ApiKeyRecord, Organization } from "../db/entities.ts";
import { execIn } from "../db/exec.ts";
import { Checks } from "./validate.ts";
import { isUuid } from "../db/uuid.ts";

const MANAGE = "manage:api_keys";

/** API keys (spec 4.2): shown once, stored as SHA-256, masked on every later read. */
export function apiKeyService(orm: MikroORM, credentials: Credentials): Partial<ServiceImpl<typeof ApiKeyService>> {
  const em = () => orm.em.fork();

  /** For calls made with an API key: the manager rules of managed keys (on the scopes the key may use now). */
  async function assertManager(ctx: HandlerContext, organizationId: string): Promise<void> {
    const org = await em().findOne(Organization, { id: organizationId });
    if (!org?.managedApiKeys) throw errors.permissionDenied("Managing API keys with an API key is not enabled for this organization");
    if (!authOf(ctx).permissions?.has(MANAGE)) throw errors.permissionDenied("This API key is not authorized to manage API keys");
  }

  /**
   * Keys visible to the caller: a manager key sees the keys it created; with a JWT an owner
   * lists every key of the organization, a member their own, and by name everyone reaches
   * only their own (as the reference does).
   */
  async function visibleKeys(ctx: HandlerContext, name?: string): Promise<ApiKeyRecord[]> {
    const caller = callerOf(ctx);
    const organizationId = organizationOf(ctx);
    const byName = name === undefined ? {} : { name };
    let where: Record<string, unknown>;
    if (caller.apiKey) {
      await assertManager(ctx, organizationId);
      where = { organizationId, createdByKeyHash: caller.apiKey.hash, ...byName };
    } else {
      const owner = authOf(ctx).memberRole === "owner";
      where = { organizationId, ...(owner && name === undefined ? {} : { userId: caller.userId }), ...byName };
    }
    return em().find(ApiKeyRecord, where, { orderBy: { lastUsedAt: "desc nulls last", createdAt: "desc" } });
  }

  async function findOne(ctx: HandlerContext, name: string): Promise<ApiKeyRecord> {
    const [key] = await visibleKeys(ctx, name);
    if (!key) throw errors.notFound("API key not found");
    return key;
  }

  return {
    async createApiKey(req, ctx) {
      const caller = callerOf(ctx);
      const organizationId = organizationOf(ctx);
      const expires = req.expiresAt === undefined ? undefined : timestampDate(req.expiresAt).getTime();
      new Checks()
        .displayName("name", req.name)
        .that(expires === undefined || !Number.isNaN(expires), "expiresAt must be a Date instance")
        // A key born expired could never be used: refused rather than created.
        .that(expires === undefined || Number.isNaN(expires) || expires > Date.now(), "expiresAt must be in the future")
        .done();
      const scopes = [...new Set(req.permissions.map(scopeOf))];
      if (caller.apiKey) await assertManager(ctx, organizationId);
      // At most what the call holds: a key's scopes its creator still has; a signed-in member their roles'.
      const held = authOf(ctx).permissions ?? new Set<string>();
      const missing = scopes.filter((s) => !held.has(s));
      if (missing.length) throw errors.permissionDenied(`Insufficient permissions for assigning: ${missing.join(", ")}`);

      const value = generateApiKey();
      const { prefix, suffix } = keyEnds(value);
      const record = em().create(ApiKeyRecord, {
        id: randomUUID(),
        organizationId,
        userId: caller.userId,
        name: req.name,
        keyHash: hashApiKey(value),
        keyPrefix: prefix,
        keySuffix: suffix,
        permissions: scopes,
        createdByKeyHash: caller.apiKey?.hash ?? null,
        createdAt: new Date(),
        lastUsedAt: null,
        expiresAt: req.expiresAt ? timestampDate(req.expiresAt) : null,
      });
      try {
        await orm.em.fork().persist(record).flush();
      } catch (err) {
        if ((err as { code?: string }).code === "23505" || /unique/i.test(String(err))) {
          throw errors.alreadyExists("API key with this name already exists");
        }
        throw err;
      }
      return {
        name: record.name,
        value,
        createdAt: timestampFromDate(record.createdAt),
        permissions: scopes.map((s) => permissionOf.get(s)!),
        expiresAt: record.expiresAt ? timestampFromDate(record.expiresAt) : undefined,
      };
    },

    async listApiKeys(_req, ctx) {
      return { items: (await visibleKeys(ctx)).map(toApiKey) };
    },

    // Served from the credential cache: the key was just validated, no query needed.
    getCurrentApiKey(_req, ctx) {
      const k = callerOf(ctx).apiKey!;
      return toApiKey({ ...k, keyPrefix: k.prefix, keySuffix: k.suffix, permissions: [...k.permissions] });
    },

    async getApiKey(req, ctx) {
      return toApiKey(await findOne(ctx, req.name));
    },

    async deleteApiKey(req, ctx) {
      const key = await findOne(ctx, req.name);
      await revoke(orm, credentials, key);
      return {};
    },

    // JWT only (route option): the key's owner, an organization owner or a system admin.
    async deleteApiKeyForUser(req, ctx) {
      const caller = callerOf(ctx);
      const organizationId = organizationOf(ctx);
      const owner = authOf(ctx).memberRole === "owner";
      if (req.userId !== caller.userId && !owner && caller.systemRole !== "admin") throw errors.permissionDenied("Incorrect user ID provided");
      const key = await em().findOne(ApiKeyRecord, { organizationId, userId: req.userId, name: req.name });
      if (!key) throw errors.notFound("API key not found");
      await revoke(orm, credentials, key);
      return {};
    },

    async setManagedApiKeys(req) {
      const org = await em().findOne(Organization, { id: isUuid(req.organizationId) ? req.organizationId : "00000000-0000-0000-0000-000000000000" });
      if (!org) throw errors.notFound(`Organization with ID ${req.organizationId} not found`);
      org.managedApiKeys = req.enabled;
      await orm.em.fork().persist(org).flush();
      return {};
    },
  };
}

/** Deletes a key and tells every control process, in the same transaction. */
async function revoke(orm: MikroORM, credentials: Credentials, key: ApiKeyRecord): Promise<void> {
  await orm.em.fork().transactional(async (em) => {
    await execIn(em)(`delete from api_key where id = ?`, [key.id]);
    await Credentials.publish(execIn(em), { kind: "key", hash: key.keyHash });
  });
  credentials.evict({ kind: "key", hash: key.keyHash });
}

type ListedKey = Pick<ApiKeyRecord, "name" | "keyPrefix" | "keySuffix" | "createdAt" | "permissions" | "lastUsedAt" | "expiresAt" | "userId">;

function toApiKey(k: ListedKey): ApiKey {
  return {
    $typeName: "sandbar.control.v1.ApiKey",
    name: k.name,
    value: maskApiKey(k.keyPrefix, k.keySuffix),
    createdAt: timestampFromDate(k.createdAt),
    permissions: k.permissions.map((s) => permissionOf.get(s)).filter((p): p is Permission => p !== undefined),
    lastUsedAt: k.lastUsedAt ? timestampFromDate(k.lastUsedAt) : undefined,
    expiresAt: k.expiresAt ? timestampFromDate(k.expiresAt) : undefined,
    userId: k.userId,
  };
}

