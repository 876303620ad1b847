import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import type { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { WarmPoolService } from "@sandbar/protocol/gen/sandbar/control/v1/warm_pool_pb.js";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { checkHost, formatChecks } from "@sandbar/runner/linux";
import type { Settings } from "../settings.ts";
import type { ProviderOpener, SandboxProvider } from "@sandbar/runner";
import { DockerProvider } from "@sandbar/runner/docker";
import { LinuxProvider } from "@sandbar/runner/linux";
import { agentInit, LocalRuntime, SHARED_VOLUME_GID } from "./local-runtime.ts";
import type { RunnerDirectory, SandboxManager } from "./manager.ts";
import { reconcile } from "./reconcile.ts";
import { ClusterLocks } from "./cluster-locks.ts";
import { InterruptedOperations } from "./recovery.ts";
import { type SandboxRuntime, unavailableRuntime } from "./runtime.ts";
import { sandboxServices } from "./service.ts";
import { runShutdownSteps } from "../server/shutdown-steps.ts";
import { AgentClients } from "../toolbox/agent-clients.ts";
import { SandboxTimers } from "./timers.ts";
import type { PoolShape } from "./warm-pool.ts";
import { WarmPools } from "./warm-pools.ts";
import { loadWarmPools, warmPoolService } from "../warm-pools/service.ts";
import { HostDiskVolumes, type VolumeStorage } from "../volumes/storage.ts";
import { DEFAULT_SNAPSHOT, DEFAULT_USER, RESOURCES } from "./create-request.ts";
import { type Snapshots, snapshotServices } from "../snapshots/service.ts";
import type { CredentialsFor } from "../snapshots/pulls.ts";
import type { BuildContexts } from "../object-storage/index.ts";
import { SandboxBuilds } from "../builds/sandbox-builds.ts";
import { buildTargets } from "../builds/build-targets.ts";
import type { BuiltImages } from "../builds/built-images.ts";
import { RemoteRuntime } from "../runners/remote-runtime.ts";
import { snapshotImageSource } from "../snapshots/image-source.ts";

/** The operator's pool holds sandboxes of what a create without resources gets. */
const POOL_SHAPE: PoolShape = { snapshot: DEFAULT_SNAPSHOT, cpu: RESOURCES.cpu.default, memory: RESOURCES.memory.default, disk: RESOURCES.disk.default, user: DEFAULT_USER };

// Sandboxes in a control process: the runtime of this host, the manager, reconciliation with
// what the host holds, then the timers. Without root (or bubblewrap) the server still runs and
// every sandbox call answers 503 with the reason.

export interface Sandboxes {
  impl: Partial<ServiceImpl<typeof SandboxService>>;
  /** The organizations' warm pools (WarmPoolService). */
  warmPools: Partial<ServiceImpl<typeof WarmPoolService>>;
  manager: SandboxManager;
  runtime: SandboxRuntime;
  timers: SandboxTimers;
  /** Connections to this host's agents, shared by the warm pool and the toolbox. */
  agentClients: AgentClients;
  /** Where volume data lives on this host. */
  volumes: VolumeStorage;
  /** Snapshots from images, pulled on this host's runtime. */
  snapshots: Snapshots;
  /** Finishes the operations of control processes that died. */
  recovery: InterruptedOperations;
  /** Shutdown began (called first, before the steps that come ahead of `stop`): no operation lock reconnects from now on. */
  stopping(): void;
  /** Stops the timers, removes the warm pool's sandboxes, lets running operations finish; other sandboxes keep running. */
  stop(): Promise<void>;
}

/** This host's runtime: the one a single-host server holds in-process and a `sandbar runner` process serves. */
async function openLocalRuntime(settings: Settings, volumes: VolumeStorage | undefined, log: (line: string) => void): Promise<LocalRuntime<SandboxProvider>> {
  return LocalRuntime.open({
    dataDir: path.join(settings.dataDir, "runner"),
    snapshotCacheDir: settings.snapshotCacheDir,
    sandboxSubnet: settings.sandboxSubnet,
    provider: providerOf(settings.sandboxProvider),
    init: await agentInit(settings.agentBundle),
    ...(volumes ? { volumeRoot: (id: string) => volumes.hostPath(id) } : {}),
    // Runtimes sharing a volume root (SANDBAR_VOLUME_ROOT) share its group, whatever their uid slots.
    ...(settings.volumeRoot ? { volumeGid: SHARED_VOLUME_GID } : {}),
    images: { mirror: settings.registries.mirror, insecureRegistries: settings.registries.insecureRegistries },
    log,
  });
}

/**
 * The runtime a `sandbar runner` serves (the runner package's daemon, started by the CLI): this
 * host's, with volumes only from a root shared with control and the region's other runners
 * (SANDBAR_VOLUME_ROOT).
 */
export function openRunnerRuntime(settings: Settings, log: (line: string) => void): { dataDir: string; version: string; sharedVolumes: boolean; openRuntime: () => Promise<SandboxRuntime> } {
  const volumes = settings.volumeRoot ? new HostDiskVolumes(settings.volumeRoot) : undefined;
  return { dataDir: path.join(settings.dataDir, "runner"), version: settings.version, sharedVolumes: !!volumes, openRuntime: () => openLocalRuntime(settings, volumes, log) };
}

/** The provider SANDBAR_PROVIDER names: a new provider is a case here and its settings. */
function providerOf(p: Settings["sandboxProvider"]): ProviderOpener {
  if (p.kind === "docker") return (host) => DockerProvider.open({ ...host, socketPath: p.dockerSocket, runtime: p.dockerRuntime });
  return (host) => LinuxProvider.open(host);
}

/** `credentialsFor`: registry credentials of snapshot pulls (the registries API's lookup); `contexts`: declarative builds' contexts; `runners`: the registered runners; `builtImages`: where built images go (the internal registry). */
export async function startSandboxes(settings: Settings, orm: MikroORM, log: (line: string) => void, credentialsFor?: CredentialsFor, contexts?: BuildContexts, runners?: RunnerDirectory, builtImages?: BuiltImages): Promise<Sandboxes> {
  let runtime: SandboxRuntime;
  const volumes = new HostDiskVolumes(settings.volumeRoot ?? path.join(settings.dataDir, "volumes"));
  if (!settings.remoteRunner) for (const line of formatChecks(await checkHost())) log(`host: ${line}`);
  try {
    runtime = settings.remoteRunner ? await RemoteRuntime.open(settings.remoteRunner) : await openLocalRuntime(settings, volumes, log);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    log(`sandboxes are unavailable: ${reason}`);
    runtime = unavailableRuntime(reason);
  }
  const agentClients = new AgentClients();
  // Pools live on this server's own runtime: the operator's (SANDBAR_WARM_POOL) and the organizations'.
  const pools = runtime instanceof LocalRuntime ? new WarmPools(runtime, agentClients, log) : undefined;
  if (pools && settings.warmPool > 0) pools.setDefault(settings.warmPool, POOL_SHAPE);
  const dropFromRunners = runners?.dropImage ? (digest: string) => runners.dropImage!(digest, log) : undefined;
  const targets = buildTargets(orm, runtime, runners);
  const runnerLogs = async function* (runnerId: string, ref: string, follow: boolean, signal: AbortSignal) {
    const { runtime: rt } = await targets("", { runnerId });
    if (!rt.snapshotLogs) throw errors.notFound(`The runner ${runnerId} keeps no build logs`);
    yield* rt.snapshotLogs(ref, follow, signal);
  };
  const held = runners?.holds ? (runnerId: string, digest: string) => runners.holds!(runnerId, digest) : undefined;
  const snapshots = snapshotServices({ orm, images: runtime.images?.bind(runtime), settings: { mirror: settings.registries.mirror }, credentialsFor, contexts, publicUrl: settings.publicUrl, dropFromRunners, log, buildTargets: targets, buildPush: builtImages?.push, held, runnerLogs });
  const builds = snapshots.builder ? new SandboxBuilds(snapshots.builder, runnerLogs) : undefined;
  // One operation per sandbox among every control process of the database (needs its URL).
  const sharedLocks = settings.databaseUrl ? new ClusterLocks(settings.databaseUrl, log) : undefined;
  const { impl, manager } = sandboxServices({ orm, settings, runtime, log, pools, snapshots: snapshots.forSandbox, layerSnapshots: snapshots.store, builds, runners, sharedLocks, imageSource: snapshotImageSource(orm, credentialsFor, settings.registries.mirror, builtImages), snapshotPush: builtImages?.snapshot });
  // A host that cannot be listed is logged, not fatal: the API still serves, and says why calls fail.
  await reconcile(manager, log).catch((err: unknown) => log(`reconcile failed: ${err instanceof Error ? err.message : String(err)}`));
  // The registered runners that answer: the same, over each one's sandboxes.
  for (const runnerId of (await runners?.ready().catch(() => [])) ?? []) {
    if (runnerId === runtime.runnerId) continue;
    await manager
      .runtimeOf({ id: runnerId, runnerId })
      .then((rt) => reconcile(manager, log, { runtime: rt, runnerId }))
      .catch((err: unknown) => log(`reconcile of runner ${runnerId} failed: ${err instanceof Error ? err.message : String(err)}`));
  }
  // After reconciliation, which removes from the host what has no row (a pool of an earlier run too).
  if (pools) await loadWarmPools(orm, pools).catch((err: unknown) => log(`warm pools not loaded: ${err instanceof Error ? err.message : String(err)}`));
  pools?.fill();
  const warmPools = warmPoolService({
    orm,
    pools,
    snapshots: snapshots.forSandbox,
    runnerId: runtime.runnerId,
    placedElsewhere: async (regionId) => (await runners?.servesRegion(regionId)) ?? false,
    maxPerOrganization: settings.warmPoolMax,
  });
  // No snapshot stays `pulling` across a restart: each unfinished pull starts again.
  await snapshots.pulls.resume().catch((err: unknown) => log(`snapshot pulls not resumed: ${err instanceof Error ? err.message : String(err)}`));
  const timers = new SandboxTimers(manager, { minuteMs: settings.timerMinuteMs, tickMs: settings.timerTickMs, log });
  timers.start();
  // What a control process that died left half done, finished by whichever process looks first.
  const recovery = new InterruptedOperations(manager, { tickMs: settings.timerTickMs, log });
  recovery.start();
  return {
    impl,
    warmPools,
    manager,
    runtime,
    timers,
    agentClients,
    volumes,
    snapshots,
    recovery,
    stopping() {
      sharedLocks?.stopping();
    },
    async stop() {
      sharedLocks?.stopping();
      await runShutdownSteps(
        [
          ["sandbox recovery", () => recovery.stop()],
          ["sandbox timers", () => timers.stop()],
          ["sandbox builds", () => builds?.close()],
          ["snapshot pulls", () => snapshots.pulls.close()],
          ["warm pools", () => pools?.close()],
          ["sandbox operations", () => manager.close()],
          ["operation locks", () => sharedLocks?.close()],
          ["sandbox runtime", () => runtime.close()],
        ],
        log,
      );
    },
  };
}
