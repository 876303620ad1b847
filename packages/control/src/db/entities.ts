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
    emailVerified: p.boolean().default(false),
    /** OpenSSH public half of the user's key pair (the private half is never stored). */
    sshPublicKey: p.string().nullable(),
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

/**
 * A sandbox. `state` is what the sandbox is, `desiredState` what an operation is driving it to;
 * the API reports a state derived from both (sandboxes/states.ts). Destroyed rows are renamed
 * DESTROYED_<name>_<ms> so the name is free again.
 */
export const SandboxRecord = defineEntity({
  name: "SandboxRecord",
  tableName: "sandbox",
  properties: {
    id: p.uuid().primary(),
    organizationId: p.uuid(),
    name: p.string(),
    snapshot: p.string().nullable(),
    osUser: p.string(),
    env: p.json<Record<string, string>>(),
    labels: p.json<Record<string, string>>(),
    public: p.boolean().default(false),
    /** Cores. */
    cpu: p.integer(),
    gpu: p.integer().default(0),
    /** GiB. */
    memory: p.integer(),
    /** GiB. */
    disk: p.integer(),
    state: p.string().default("unknown"),
    desiredState: p.string().default("started"),
    errorReason: p.text().nullable(),
    /** None, Pending, InProgress, Completed or Error (the reference's spelling). */
    backupState: p.string().default("None"),
    backupCreatedAt: p.datetime().nullable(),
    /** Minutes; 0 disables. */
    autoStopInterval: p.integer().default(15),
    /** Minutes; 0 means the maximum. */
    autoArchiveInterval: p.integer().default(10080),
    /** Minutes; -1 disabled, 0 deleted on stop. */
    autoDeleteInterval: p.integer().default(-1),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()),
    lastActivityAt: p.datetime().nullable(),
    /** The preview token; rotated on every start. */
    authToken: p.string(),
    /** The runner holding the sandbox's files; null when archived or destroyed. */
    runnerId: p.string().nullable(),
  },
});
export type SandboxRecord = InferEntity<typeof SandboxRecord>;

export const entities = [User, Organization, OrganizationMember, ApiKeyRecord, SandboxRecord];
