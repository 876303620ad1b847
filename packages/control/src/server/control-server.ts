import { SigningKeys, signedUrlKeys, signingKeyMethods } from "../sandboxes/signing-keys.ts";
import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { MikroORM } from "@mikro-orm/postgresql";
import { filesIn } from "@sandbar/protocol";
import { file_grpc_health_v1_health, Health } from "@sandbar/protocol/gen/grpc/health/v1/health_pb.js";
import { file_grpc_reflection_v1_reflection, ServerReflection } from "@sandbar/protocol/gen/grpc/reflection/v1/reflection_pb.js";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { AuditService } from "@sandbar/protocol/gen/sandbar/control/v1/audit_pb.js";
import { ConfigService } from "@sandbar/protocol/gen/sandbar/control/v1/config_pb.js";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { changesRoutes } from "../sandboxes/changes-route.ts";
import { sandboxChangesService } from "../sandboxes/changes-service.ts";
import { SnapshotService } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import {
  OrganizationInvitationService,
  OrganizationMemberService,
  OrganizationRoleService,
  OrganizationService,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { PreviewService } from "@sandbar/protocol/gen/sandbar/control/v1/preview_pb.js";
import { RegionService } from "@sandbar/protocol/gen/sandbar/control/v1/region_pb.js";
import { DockerRegistryService, ObjectStorageService } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import { UserService } from "@sandbar/protocol/gen/sandbar/control/v1/user_pb.js";
import { WebhookService } from "@sandbar/protocol/gen/sandbar/control/v1/webhook_pb.js";
import { VolumeService } from "@sandbar/protocol/gen/sandbar/control/v1/volume_pb.js";
import { volumeService } from "../volumes/service.ts";
import { AuditRecorder } from "../audit/recorder.ts";
import { AuditRetention } from "../audit/retention.ts";
import { auditService } from "../audit/service.ts";
import { Credentials } from "../auth/credentials.ts";
import { Guard } from "../auth/guard.ts";
import { SecretBox } from "../auth/secret-box.ts";
import { RunnerHealth } from "../runners/health.ts";
import { RegisteredRunners } from "../runners/directory.ts";
import { runnerService } from "../runners/service.ts";
import { RunnerService } from "@sandbar/protocol/gen/sandbar/control/v1/runner_pb.js";
import { WarmPoolService } from "@sandbar/protocol/gen/sandbar/control/v1/warm_pool_pb.js";
import { bootstrap } from "../bootstrap.ts";
import { startEmbeddedPostgres, type RunningPostgres } from "../db/embedded-postgres.ts";
import { openDatabase } from "../db/orm.ts";
import { grpcUnaryFastPath } from "../rpc/grpc-unary.ts";
import { CallChain } from "../call/chain.ts";
import { newCall, callKey } from "../call/call.ts";
import { createGateway } from "../gateway/handler.ts";
import { MAX_JSON_BODY } from "../gateway/http-io.ts";
import { RouteTable } from "../gateway/route-table.ts";
import { startIdentity, type Identity } from "../identity/index.ts";
import { startPreview } from "../preview/index.ts";
import { startRateLimits } from "../limits/index.ts";
import { type ObjectStorage, startObjectStorageService } from "../object-storage/index.ts";
import { healthService } from "../rpc/health.ts";
import { reflectionService } from "../rpc/reflection.ts";
import { type Sandboxes, startSandboxes } from "../sandboxes/boot.ts";
import { builtImagesIn } from "../builds/built-images.ts";
import type { CredentialsFor } from "../snapshots/pulls.ts";
import { apiKeyService } from "../services/api-keys.ts";
import { configService } from "../services/config.ts";
import { organizationInvitationService } from "../services/organization-invitations.ts";
import { organizationMemberService } from "../services/organization-members.ts";
import { organizationRoleService } from "../services/organization-roles.ts";
import { organizationService } from "../services/organizations.ts";
import { regionService } from "../services/regions.ts";
import { dockerRegistryService, registryCredentialsFor, startInternalRegistry } from "../registries/index.ts";
import { userService } from "../services/users.ts";
import { asHttp1 } from "../casts.ts";
import type { Settings } from "../settings.ts";
import { addressList, trustProxies } from "./client-address.ts";
import { connectionLimits } from "./connection-limits.ts";
import { listenOnePort } from "./listener.ts";
import { raiseOpenFilesLimit } from "./open-files.ts";
import { runShutdownSteps } from "./shutdown-steps.ts";
import type { AgentLocator } from "../toolbox/agent-locator.ts";
import { mountToolbox, TOOLBOX_PREFIXES } from "../toolbox/mount.ts";
import { startWebhooks } from "../webhooks/index.ts";
import { toolboxRest } from "../toolbox/rest/index.ts";

export const API_BASE = "/api";

export interface ControlServer {
  url: string;
  port: number;
  databaseUrl: string;
  orm: MikroORM;
  /** Sign-in: the built-in issuer (when on) and what /config advertises. */
  identity: Identity;
  /** The sandboxes of this host: manager, runtime, timers. */
  sandboxes: Sandboxes;
  /** Build contexts' object storage (the store, the S3 endpoint). */
  objectStorage: ObjectStorage;
  /** The call chain every entry point invokes methods through (a new way in is an adapter of it). */
  chain: CallChain;
  stop(): Promise<void>;
}

/**
 * The control process: PostgreSQL (embedded unless DATABASE_URL is set), migrations,
 * bootstrap, then one port serving the REST gateway under /api and Connect, gRPC and
 * gRPC-Web for every service, with gRPC health and reflection.
 */
export interface ControlOptions {
  /** Locates agents for the toolbox; default: the sandboxes this server runs. */
  agentLocator?: AgentLocator;
  /**
   * Registry credentials for snapshot pulls, per organization and registry host; default: the
   * organization's registries (the registries API).
   */
  registryCredentials?: CredentialsFor;
}

export async function startControlServer(settings: Settings, log: (line: string) => void = console.log, options: ControlOptions = {}): Promise<ControlServer> {
  trustProxies(settings.trustedProxies);
  // First, so that what the server starts (PostgreSQL) inherits it too.
  const files = raiseOpenFilesLimit();
  let pg: RunningPostgres | undefined;
  const databaseUrl = settings.databaseUrl ?? (pg = await startEmbeddedPostgres(settings.dataDir, log)).url;
  const orm = await openDatabase(databaseUrl);
  const credentials = new Credentials(databaseUrl);
  await credentials.start(databaseUrl);
  await bootstrap(orm, settings.dataDir, settings.bootstrapApiKey, log, settings.oidc ? false : { preset: settings.bootstrapPassword }, settings.printSecrets);
  const identity = await startIdentity(settings, databaseUrl, credentials, log);
  const limits = startRateLimits(settings.rateLimits, databaseUrl, log);
  const guard = new Guard(credentials, limits);
  // Every state-changing call is recorded on its way through the chain (toolbox calls on request).
  const recorder = new AuditRecorder(orm, log);
  const chain = new CallChain(guard, recorder);
  const foreign = chain.foreignAdmission();
  const box = await SecretBox.open(orm, settings.encryptionKey);
  const pushRegistry = await startInternalRegistry(settings.internalRegistry, settings.dataDir, orm, log, foreign);
  const savedCredentials = options.registryCredentials ?? ((organizationId, host) => registryCredentialsFor(orm, organizationId, host, box));
  // Images in the internal registry pull with the organization's own short-lived account.
  const internalRegistry = pushRegistry.registry;
  const registryCredentials: CredentialsFor = (organizationId, host) => (internalRegistry?.owns(host) ? internalRegistry.pullCredentials(organizationId) : savedCredentials(organizationId, host));
  const objectStorage = await startObjectStorageService(settings.objectStorage, settings.dataDir, settings.publicUrl, orm, foreign);
  const runners = new RegisteredRunners(orm, box);
  const sandboxes = await startSandboxes({ ...settings, databaseUrl }, orm, log, registryCredentials, objectStorage.contexts, runners, internalRegistry && builtImagesIn(internalRegistry));
  const webhooks = await startWebhooks(orm, box, settings.webhooks, databaseUrl, log);
  const runnerHealth = new RunnerHealth(orm, box, { ...settings.runnerChecks, log });
  runnerHealth.start();
  const auditRetention = new AuditRetention(orm, { retentionDays: settings.auditRetentionDays, minuteMs: settings.timerMinuteMs, tickMs: settings.timerTickMs, log });
  auditRetention.start();
  const preview = await startPreview({ orm, settings, manager: sandboxes.manager, credentials, chain, basePath: API_BASE });

  const controlFiles = await filesIn("sandbar/control/v1");
  chain.mount(ConfigService, configService(settings, identity.oidc, limits.advertised()));
  chain.mount(ApiKeyService, apiKeyService(orm, credentials));
  const signingKeys = new SigningKeys(orm, box);
  chain.mount(SandboxService, { ...sandboxes.impl, ...preview.sandboxMethods, ...signingKeyMethods(sandboxes.manager, signingKeys) });
  chain.mount(PreviewService, preview.service);
  chain.mount(SnapshotService, sandboxes.snapshots.impl);
  chain.mount(UserService, userService(orm, credentials));
  chain.mount(OrganizationService, organizationService(orm, credentials, box));
  chain.mount(OrganizationRoleService, organizationRoleService(orm, credentials));
  chain.mount(OrganizationMemberService, organizationMemberService(orm, credentials));
  chain.mount(OrganizationInvitationService, organizationInvitationService(orm, credentials));
  chain.mount(RegionService, regionService(orm));
  chain.mount(DockerRegistryService, dockerRegistryService(orm, box, pushRegistry));
  chain.mount(WebhookService, webhooks.impl);
  chain.mount(AuditService, auditService(orm));
  chain.mount(VolumeService, volumeService(orm, sandboxes.volumes, log));
  chain.mount(ObjectStorageService, objectStorage.impl);
  chain.mount(RunnerService, runnerService(orm, box));
  chain.mount(WarmPoolService, sandboxes.warmPools);
  chain.mount(SandboxChangesService, sandboxChangesService(sandboxes.manager, sandboxes.snapshots.store));
  const services = controlFiles.flatMap((f) => f.services);
  // Every service of the contract is served; those without an implementation yet answer UNIMPLEMENTED (REST 501).
  for (const service of services) if (!chain.serves(service)) chain.mount(service, {});

  // The toolbox: the agent's services, forwarded to the sandbox each call names.
  const agentLocator: AgentLocator = options.agentLocator ?? sandboxes.manager;
  const toolbox = await mountToolbox(chain, agentLocator, sandboxes.agentClients, settings.auditToolbox);

  const serviceNames = [...services, ...toolbox.services].map((s) => s.typeName).concat(Health.typeName, ServerReflection.typeName);
  const rpc = connectNodeAdapter({
    readMaxBytes: MAX_JSON_BODY, // per message, as REST bodies (uploads stream in small chunks)
    // Connect's adapter into the chain: every request gets its Call here.
    contextValues: (req) => createContextValues().set(callKey, newCall(req)),
    routes(router) {
      for (const service of [...services, ...toolbox.services]) router.service(service, chain.implementation(service));
      router.service(Health, healthService(new Set(serviceNames), async () => orm.isConnected()));
      router.service(ServerReflection, reflectionService([...controlFiles, ...toolbox.files, file_grpc_health_v1_health, file_grpc_reflection_v1_reflection], serviceNames));
    },
  });
  // One route table: the contract's routes, the toolbox's agent routes under each prefix, the
  // toolbox routes written by hand (multipart, raw streams, WebSockets) and the preview proxy's path form.
  const rest = toolboxRest({ chain, locator: agentLocator, prefixes: TOOLBOX_PREFIXES, signedUrls: signedUrlKeys(sandboxes.manager, signingKeys) });
  const routes = new RouteTable([{ services }, ...TOOLBOX_PREFIXES.map((prefix) => ({ services: toolbox.services, prefix, omitUnset: true }))], {
    handwritten: [...rest.handwritten, ...preview.routes.handwritten, ...changesRoutes(chain)],
    upgrades: [...rest.upgrades, ...preview.routes.upgrades],
  });
  const gateway = createGateway(routes, chain, API_BASE);
  // The toolbox's unary gRPC calls in their plain form skip Connect's pipeline (not the chain).
  const grpcUnary = grpcUnaryFastPath(toolbox.services, (ctx, input) => chain.unary(ctx, input), MAX_JSON_BODY);

  const connections = connectionLimits(settings, files, log);
  log(
    `connections: at most ${connections.maxConnections}, ${connections.maxConnectionsPerAddress || "any number"} per client address` +
      (files ? ` (open files limit ${files.soft}${files.raisedFrom ? `, raised from ${files.raisedFrom}` : ""}${files.error ? `; not raised to ${files.hard}: ${files.error}` : ""})` : ""),
  );
  const listener = await listenOnePort(
    (req, res) => {
      const url = req.url ?? "";
      const [r1, w1] = asHttp1(req, res);
      // The preview proxy's host form owns its hosts whole, /api included.
      if (preview.ownsHost(req)) preview.serveHost(r1, w1);
      else if (url === API_BASE || url.startsWith(API_BASE + "/") || url.startsWith(API_BASE + "?")) void gateway.handle(r1, w1);
      else if (identity.owns(url)) identity.handle(r1, w1);
      // The S3 endpoint of build contexts: its own protocol and signatures (object-storage/s3-proxy.ts).
      else if (objectStorage.proxy.owns(url)) void objectStorage.proxy.handle(r1, w1);
      else if (!grpcUnary(req, res)) rpc(req, res);
    },
    settings.port,
    settings.host,
    (req, socket, head) => preview.upgradeHost(req, socket, head) || gateway.upgrade(req, socket, head),
    settings.proxyProtocolFrom.length ? { from: addressList(settings.proxyProtocolFrom), log } : undefined,
    connections,
  );
  const port = listener.port;
  let stopped: Promise<void> | undefined;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    databaseUrl,
    orm,
    identity,
    sandboxes,
    objectStorage,
    chain,
    stop: () => {
      // Before anything is awaited: the database may be going down with the same signal.
      sandboxes.stopping();
      return (stopped ??= runShutdownSteps(
        [
          ["toolbox routes", () => rest.close()],
          ["preview proxy", () => preview.close()],
          ["listener", () => listener.close()],
          ["audit retention", () => auditRetention.stop()],
          ["runner health checks", () => runnerHealth.stop()],
          ["registered runners", () => runners.close()],
          ["sandboxes", () => sandboxes.stop()],
          ["internal registry", () => internalRegistry?.stop()],
          ["webhooks", () => webhooks.stop()],
          ["object storage", () => objectStorage.close()],
          ["agent connections", () => toolbox.clients.close()],
          ["identity", () => identity.stop()],
          ["credentials", () => credentials.stop()],
          ["rate limits", () => limits.close()],
          ["database connections", () => orm.close()],
          ["embedded PostgreSQL", () => pg?.stop()],
        ],
        log,
      ));
    },
  };
}
