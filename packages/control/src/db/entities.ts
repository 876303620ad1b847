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
    defaultRegionId: p.string().nullable(),
    /** Cores and GiB; a region quota's own maxima take precedence. */
    maxCpuPerSandbox: p.integer().default(4),
    maxMemoryPerSandbox: p.integer().default(8),
    maxDiskPerSandbox: p.integer().default(10),
    maxSnapshotSize: p.integer().default(20),
    snapshotQuota: p.integer().default(30),
    volumeQuota: p.integer().default(100),
    /** Rate-limit overrides; null: the server's default. */
    authenticatedRateLimit: p.integer().nullable(),
    sandboxCreateRateLimit: p.integer().nullable(),
    sandboxLifecycleRateLimit: p.integer().nullable(),
    authenticatedRateLimitTtlSeconds: p.integer().nullable(),
    sandboxCreateRateLimitTtlSeconds: p.integer().nullable(),
    sandboxLifecycleRateLimitTtlSeconds: p.integer().nullable(),
    suspended: p.boolean().default(false),
    suspendedAt: p.datetime().nullable(),
    suspensionReason: p.text().nullable(),
    suspendedUntil: p.datetime().nullable(),
    suspensionCleanupGracePeriodHours: p.integer().default(24),
    snapshotDeactivationTimeoutMinutes: p.integer().default(20160),
    sandboxLimitedNetworkEgress: p.boolean().default(false),
    experimentalConfig: p.json<Record<string, unknown>>().nullable(),
    /** Header values encrypted (secrets.ts). */
    otelConfig: p.json<StoredOtelConfig>().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()).onUpdate(() => new Date()),
  },
});
export type Organization = InferEntity<typeof Organization>;
export interface StoredOtelConfig {
  endpoint: string;
  /** Name -> encrypted value. */
  headers: Record<string, string>;
}

/** Where sandboxes run: shared by all organizations, or an organization's own (custom). */
export const Region = defineEntity({
  name: "Region",
  tableName: "region",
  properties: {
    id: p.string().primary(),
    name: p.string().unique(),
    organizationId: p.uuid().nullable(),
    /** "shared", "dedicated" or "custom". */
    regionType: p.string(),
    enforceQuotas: p.boolean().default(false),
    proxyUrl: p.text().nullable(),
    sshGatewayUrl: p.text().nullable(),
    snapshotManagerUrl: p.text().nullable(),
    /** SHA-256 (hex) of each service credential; the values are shown once. */
    proxyApiKeyHash: p.string().nullable(),
    sshGatewayApiKeyHash: p.string().nullable(),
    snapshotManagerPasswordHash: p.string().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()).onUpdate(() => new Date()),
  },
});
export type Region = InferEntity<typeof Region>;

/** An organization's totals in one region and sandbox class. */
const RegionQuota = defineEntity({
  name: "RegionQuota",
  tableName: "region_quota",
  properties: {
    organizationId: p.uuid().primary(),
    regionId: p.string().primary(),
    sandboxClass: p.string().primary(),
    totalCpuQuota: p.integer().default(10),
    totalMemoryQuota: p.integer().default(10),
    totalDiskQuota: p.integer().default(30),
    totalGpuQuota: p.integer().default(0),
    maxCpuPerSandbox: p.integer().nullable(),
    maxMemoryPerSandbox: p.integer().nullable(),
    maxDiskPerSandbox: p.integer().nullable(),
  },
  primaryKeys: ["organizationId", "regionId", "sandboxClass"],
});

/** A named bundle of permissions; global ones (no organization) are seeded and fixed. */
const OrganizationRole = defineEntity({
  name: "OrganizationRole",
  tableName: "organization_role",
  properties: {
    id: p.uuid().primary(),
    organizationId: p.uuid().nullable(),
    name: p.string(),
    description: p.text().default(""),
    permissions: p.array(),
    isGlobal: p.boolean().default(false),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()),
  },
});

const OrganizationMemberRole = defineEntity({
  name: "OrganizationMemberRole",
  tableName: "organization_member_role",
  properties: {
    organizationId: p.uuid().primary(),
    userId: p.string().primary(),
    roleId: p.uuid().primary(),
  },
  primaryKeys: ["organizationId", "userId", "roleId"],
});

const OrganizationInvitation = defineEntity({
  name: "OrganizationInvitation",
  tableName: "organization_invitation",
  properties: {
    id: p.uuid().primary(),
    organizationId: p.uuid(),
    /** Lower-cased and trimmed. */
    email: p.string(),
    /** The inviter's e-mail. */
    invitedBy: p.string(),
    /** "owner" or "member". */
    role: p.string(),
    /** pending, accepted, declined or cancelled; "expired" is derived from expiresAt. */
    status: p.string().default("pending"),
    expiresAt: p.datetime(),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()),
  },
});

const OrganizationInvitationRole = defineEntity({
  name: "OrganizationInvitationRole",
  tableName: "organization_invitation_role",
  properties: {
    invitationId: p.uuid().primary(),
    roleId: p.uuid().primary(),
  },
  primaryKeys: ["invitationId", "roleId"],
});

export const OrganizationMember = defineEntity({
  name: "OrganizationMember",
  tableName: "organization_member",
  properties: {
    organizationId: p.uuid().primary(),
    userId: p.string().primary(),
    /** "owner" or "member". */
    role: p.string(),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()),
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
    /** The GPU type placement pinned it to (migration 0021); null without GPU. */
    gpuType: p.string().nullable(),
    /** container, linux-vm, android or windows (migration 0021): only a runner of its class takes it. */
    sandboxClass: p.string().default("container"),
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
    /** Minutes of inactivity before a started sandbox is paused; 0 disables (migration 0024). */
    autoPauseInterval: p.integer().default(0),
    createdAt: p.datetime().onCreate(() => new Date()),
    updatedAt: p.datetime().onCreate(() => new Date()),
    lastActivityAt: p.datetime().nullable(),
    /** The preview token; rotated on every start. */
    authToken: p.string(),
    regionId: p.string().default("local"),
    /** The runner holding the sandbox's files; null when archived or destroyed. */
    runnerId: p.string().nullable(),
    /** The volumes it mounts (migration 0013), volume ids resolved. */
    volumes: p.json<SandboxVolumeMount[]>(),
    /** The image it boots from (manifest digest in the host's image store); null: the default snapshot. */
    imageRef: p.string().nullable(),
    /** Loopback only (unless networkAllowList is set). */
    networkBlockAll: p.boolean().default(true),
    /** Comma-separated IPv4 CIDRs, the only destinations reachable; null: none given. */
    networkAllowList: p.text().nullable(),
    /** The declarative build it was made from (migration 0016); null otherwise. */
    buildInfo: p.json<{ dockerfileContent: string; contextHashes: string[]; snapshotRef: string; createdAt: string }>().nullable(),
    /** When the TTL deletes it whatever its state (migration 0026); null without a TTL. */
    autoDestroyAt: p.datetime().nullable(),
    /** Its `error` left its files intact: recover (or start) brings it back (migration 0026). */
    recoverable: p.boolean().default(false),
    /** The key its signed file URLs are checked with, sealed (migration 0026); null until first asked for. */
    signingKeySealed: p.text().nullable(),
    /** The organization's warm pool whose sandbox its create claimed (migration 0027); null otherwise. */
    warmPoolId: p.uuid().nullable(),
    /** Captured layers above its image, top first (migration 0025): a fork's, or a running sandbox's snapshot's; null: none. */
    layers: p.json<string[]>().nullable(),
    /** The sandbox it was forked from (migration 0025); null otherwise. */
    parentId: p.uuid().nullable(),
  },
});
export interface SandboxVolumeMount {
  volumeId: string;
  mountPath: string;
  subpath?: string;
}
export type SandboxRecord = InferEntity<typeof SandboxRecord>;

export const entities = [
  User, Organization, OrganizationMember, ApiKeyRecord, SandboxRecord, Region, RegionQuota,
  OrganizationRole, OrganizationMemberRole, OrganizationInvitation, OrganizationInvitationRole,
];
