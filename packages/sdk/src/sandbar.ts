import type { Client } from "@connectrpc/connect";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { ConfigService } from "@sandbar/protocol/gen/sandbar/control/v1/config_pb.js";
import {
  OrganizationInvitationService,
  OrganizationMemberService,
  OrganizationRoleService,
  OrganizationService,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { RegionService } from "@sandbar/protocol/gen/sandbar/control/v1/region_pb.js";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { SnapshotService } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import { UserService } from "@sandbar/protocol/gen/sandbar/control/v1/user_pb.js";
import { VolumeService } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
import { resolveConfig, type ResolvedConfig, type SandbarOptions } from "./config.ts";
import { sandbarClient } from "./clients.ts";
import { ApiKeys, Organizations, Snapshots, Volumes } from "./resources.ts";
import type { RetryOptions } from "./retry.ts";
import { Sandboxes } from "./sandboxes.ts";
import { createSandbarTransport, type TokenProvider } from "./transport.ts";

export interface SandbarClientOptions extends SandbarOptions {
  /** Retries of idempotent calls refused with 429 or 503 (default: 4 attempts, Retry-After honoured). */
  retry?: RetryOptions;
  /**
   * Asked for the bearer token before every call, instead of a fixed apiKey/jwtToken: a signed-in
   * person's access token that the caller refreshes when it expires. Sent with `organizationId`.
   */
  tokenProvider?: TokenProvider;
}

/**
 * Sandbar's client. Configuration comes from `options`, then the SANDBAR_* environment, a `.env`
 * file in the working directory, the config file's profile, and defaults (see resolveConfig).
 * Every call takes CallOptions (`signal`, `timeoutMs`, `headers`) and fails with a SandbarError.
 */
export class Sandbar {
  readonly config: ResolvedConfig;
  readonly sandboxes: Sandboxes;
  readonly snapshots: Snapshots;
  readonly volumes: Volumes;
  readonly apiKeys: ApiKeys;
  readonly organizations: Organizations;
  /** Every control service's generated client, for calls the wrappers above leave out. */
  readonly services: {
    config: Client<typeof ConfigService>;
    sandboxes: Client<typeof SandboxService>;
    snapshots: Client<typeof SnapshotService>;
    volumes: Client<typeof VolumeService>;
    apiKeys: Client<typeof ApiKeyService>;
    organizations: Client<typeof OrganizationService>;
    invitations: Client<typeof OrganizationInvitationService>;
    roles: Client<typeof OrganizationRoleService>;
    members: Client<typeof OrganizationMemberService>;
    users: Client<typeof UserService>;
    regions: Client<typeof RegionService>;
  };
  private readonly closeTransport: () => void;

  constructor(options: SandbarClientOptions = {}) {
    this.config = resolveConfig(options);
    const { transport, close } = createSandbarTransport(this.config, options.retry, options.tokenProvider);
    this.closeTransport = close;
    this.services = {
      config: sandbarClient(ConfigService, transport),
      sandboxes: sandbarClient(SandboxService, transport),
      snapshots: sandbarClient(SnapshotService, transport),
      volumes: sandbarClient(VolumeService, transport),
      apiKeys: sandbarClient(ApiKeyService, transport),
      organizations: sandbarClient(OrganizationService, transport),
      invitations: sandbarClient(OrganizationInvitationService, transport),
      roles: sandbarClient(OrganizationRoleService, transport),
      members: sandbarClient(OrganizationMemberService, transport),
      users: sandbarClient(UserService, transport),
      regions: sandbarClient(RegionService, transport),
    };
    this.sandboxes = new Sandboxes(this.services.sandboxes, transport, this.config.target);
    this.snapshots = new Snapshots(this.services.snapshots);
    this.volumes = new Volumes(this.services.volumes);
    this.apiKeys = new ApiKeys(this.services.apiKeys);
    this.organizations = new Organizations(this.services.organizations);
  }

  /** Closes the connection; calls after this open a new one. */
  close(): void {
    this.closeTransport();
  }
}
