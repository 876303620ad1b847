import { getOption, hasOption, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { ApiKey, ApiKeyService, CreateApiKeyResponse } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import type { Organization, OrganizationService, OrganizationUsageOverview } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { Permission, PermissionSchema } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import {
  SnapshotState,
  type CreateSnapshotRequestSchema,
  type ListSnapshotsRequestSchema,
  type PaginatedSnapshots,
  type Snapshot,
  type SnapshotService,
} from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import type { Volume, VolumeService } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
import { json } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import { setTimeout } from "node:timers/promises";
import { InvalidArgumentError, SandbarError, TimeoutError, toSandbarError } from "./errors.ts";

export class Snapshots {
  /** The generated SnapshotService client (toggle, activate, deactivate, general flag). */
  readonly client: Client<typeof SnapshotService>;

  constructor(client: Client<typeof SnapshotService>) {
    this.client = client;
  }

  /** Starts building (pulling) a snapshot; follow it with buildLogs() or waitUntilActive(). */
  create(params: MessageInitShape<typeof CreateSnapshotRequestSchema>, opts?: CallOptions): Promise<Snapshot> {
    return this.client.createSnapshot(params, opts);
  }

  list(params: MessageInitShape<typeof ListSnapshotsRequestSchema> = {}, opts?: CallOptions): Promise<PaginatedSnapshots> {
    return this.client.listSnapshots(params, opts);
  }

  /** By id or name. */
  get(idOrName: string, opts?: CallOptions): Promise<Snapshot> {
    return this.client.getSnapshot({ id: idOrName }, opts);
  }

  async delete(idOrName: string, opts?: CallOptions): Promise<void> {
    await this.client.deleteSnapshot({ id: idOrName }, opts);
  }

  /** The build's log lines as they are written; with `follow` (default) until the build ends. */
  async *buildLogs(idOrName: string, o: { follow?: boolean } & CallOptions = {}): AsyncGenerator<string> {
    const { follow = true, ...opts } = o;
    const decoder = new TextDecoder();
    let pending = "";
    for await (const chunk of this.client.getSnapshotBuildLogs({ id: idOrName, follow }, opts)) {
      pending += decoder.decode(chunk.data, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      yield* lines;
    }
    pending += decoder.decode();
    if (pending) yield pending;
  }

  /** Polls until the snapshot is active; error or build-failed is a SandbarError with the reason. */
  async waitUntilActive(idOrName: string, o: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Snapshot> {
    const limit = o.timeoutMs ?? 300_000;
    const until = Date.now() + limit;
    for (;;) {
      const s = await this.get(idOrName, { signal: o.signal });
      if (s.state === SnapshotState.ACTIVE) return s;
      if (s.state === SnapshotState.ERROR || s.state === SnapshotState.BUILD_FAILED) {
        throw new SandbarError(`snapshot ${s.name} failed: ${s.errorReason ?? "no reason given"}`, "failed_precondition", 409);
      }
      if (Date.now() > until) throw new TimeoutError(`snapshot ${s.name} still ${SnapshotState[s.state].toLowerCase()} after ${limit} ms`, "deadline_exceeded", 408);
      await setTimeout(250, undefined, { signal: o.signal }).catch((err: unknown) => {
        throw toSandbarError(err, o.signal);
      });
    }
  }
}

export class Volumes {
  /** The generated VolumeService client. */
  readonly client: Client<typeof VolumeService>;

  constructor(client: Client<typeof VolumeService>) {
    this.client = client;
  }

  create(name: string, opts?: CallOptions): Promise<Volume> {
    return this.client.createVolume({ name }, opts);
  }

  async list(o: { includeDeleted?: boolean } & CallOptions = {}): Promise<Volume[]> {
    const { includeDeleted, ...opts } = o;
    return (await this.client.listVolumes({ includeDeleted }, opts)).items;
  }

  get(volumeId: string, opts?: CallOptions): Promise<Volume> {
    return this.client.getVolume({ volumeId }, opts);
  }

  getByName(name: string, opts?: CallOptions): Promise<Volume> {
    return this.client.getVolumeByName({ name }, opts);
  }

  async delete(volumeId: string, opts?: CallOptions): Promise<void> {
    await this.client.deleteVolume({ volumeId }, opts);
  }
}

/** A scope as the API spells it ("write:sandboxes") or its generated enum value. */
export type Scope = Permission | string;

/** The Permission of a scope spelled as the API spells it; an unknown one is an InvalidArgumentError naming it. */
export function permissionOf(scope: Scope): Permission {
  if (typeof scope === "number") return scope;
  const value = PermissionSchema.values.find((v) => hasOption(v, json) && getOption(v, json) === scope);
  if (!value) throw new InvalidArgumentError(`permissions: unknown scope ${JSON.stringify(scope)}`, "invalid_argument", 400);
  return value.number as Permission;
}

export class ApiKeys {
  /** The generated ApiKeyService client. */
  readonly client: Client<typeof ApiKeyService>;

  constructor(client: Client<typeof ApiKeyService>) {
    this.client = client;
  }

  /** A new key; its `value` is in this answer only. */
  create(params: { name: string; permissions: Scope[]; expiresAt?: Date }, opts?: CallOptions): Promise<CreateApiKeyResponse> {
    const expiresAt = params.expiresAt && timestampFromDate(params.expiresAt);
    return this.client.createApiKey({ name: params.name, permissions: params.permissions.map(permissionOf), expiresAt }, opts);
  }

  async list(opts?: CallOptions): Promise<ApiKey[]> {
    return (await this.client.listApiKeys({}, opts)).items;
  }

  /** The key this client calls with (API keys only). */
  current(opts?: CallOptions): Promise<ApiKey> {
    return this.client.getCurrentApiKey({}, opts);
  }

  get(name: string, opts?: CallOptions): Promise<ApiKey> {
    return this.client.getApiKey({ name }, opts);
  }

  async delete(name: string, opts?: CallOptions): Promise<void> {
    await this.client.deleteApiKey({ name }, opts);
  }
}

export class Organizations {
  /** The generated OrganizationService client (quota, suspension, OpenTelemetry settings...). */
  readonly client: Client<typeof OrganizationService>;

  constructor(client: Client<typeof OrganizationService>) {
    this.client = client;
  }

  /** The caller's organizations. */
  async list(opts?: CallOptions): Promise<Organization[]> {
    return (await this.client.listOrganizations({}, opts)).items;
  }

  get(organizationId: string, opts?: CallOptions): Promise<Organization> {
    return this.client.getOrganization({ organizationId }, opts);
  }

  /** A new organization owned by the signed-in person (JWT only), in a region of `services.regions.listSharedRegions()`. */
  create(params: { name: string; defaultRegionId: string }, opts?: CallOptions): Promise<Organization> {
    return this.client.createOrganization(params, opts);
  }

  async delete(organizationId: string, opts?: CallOptions): Promise<void> {
    await this.client.deleteOrganization({ organizationId }, opts);
  }

  usage(organizationId: string, opts?: CallOptions): Promise<OrganizationUsageOverview> {
    return this.client.getUsage({ organizationId }, opts);
  }
}
