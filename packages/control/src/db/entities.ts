import { defineEntity, type InferEntity, p } from "@mikro-orm/core";

// Tables for identity and API keys. Columns are the snake_case of the property
// names (MikroORM's default naming); migrations/ creates them.

export const User = defineEntity({
  name: "User",
  tableName: "user",
  properties: {
    id: p.string().primary(),
    name: p.string(),
    email: p.string().default(""),
    /** System role: "admin" may use operator routes. */
    role: p.string().default("user"),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
});
export type User = InferEntity<typeof User>;

export const Organization = defineEntity({
  name: "Organization",
  tableName: "organization",
  properties: {
    id: p.uuid().primary(),
    name: p.string(),
    personal: p.boolean().default(false),
    createdBy: p.string(),
    /** Operator switch: keys with manage:api_keys may create, list and delete child keys. */
    managedApiKeys: p.boolean().default(false),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()).onUpdate(() => new Date()),
  },
});
export type Organization = InferEntity<typeof Organization>;

export const OrganizationMember = defineEntity({
  name: "OrganizationMember",
  tableName: "organization_member",
  properties: {
    organizationId: p.uuid().primary(),
    userId: p.string().primary(),
    /** "owner" or "member". */
    role: p.string(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
  primaryKeys: ["organizationId", "userId"],
});
export type OrganizationMember = InferEntity<typeof OrganizationMember>;

export const ApiKeyRecord = defineEntity({
  name: "ApiKeyRecord",
  tableName: "api_key",
  properties: {
    id: p.uuid().primary(),
    organizationId: p.uuid(),
    userId: p.string(),
    name: p.string(),
    /** SHA-256 (hex) of the key: the only form of the secret that is stored. */
    keyHash: p.string().unique(),
    keyPrefix: p.string(),
    keySuffix: p.string(),
    permissions: p.array(),
    /** The manager key (its hash) that created this key, when created with an API key. */
    createdByKeyHash: p.string().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
    lastUsedAt: p.datetime().nullable(),
    expiresAt: p.datetime().nullable(),
  },
});
export type ApiKeyRecord = InferEntity<typeof ApiKeyRecord>;

export const entities = [User, Organization, OrganizationMember, ApiKeyRecord];
