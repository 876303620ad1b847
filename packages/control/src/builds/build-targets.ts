import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { targetRegion } from "../organizations/target-region.ts";
import type { RunnerDirectory } from "../sandboxes/manager.ts";
import type { SandboxRuntime } from "../sandboxes/runtime.ts";

// Which host runs a build: the runner a sandbox was placed on (it then holds its image), else in a
// region with registered runners one picked as placement picks (ready, schedulable, not draining,
// room for the build's resources, the most free CPU), else this process's own runtime (in-process,
// or the one runner of SANDBAR_RUNNER_URL). The call is the same whichever it is.

export interface BuildWhere {
  runnerId?: string;
  regionId?: string;
  need?: { cpu: number; memory: number; disk: number };
}

export type BuildTargets = (organizationId: string, where: BuildWhere) => Promise<{ runnerId: string; runtime: SandboxRuntime }>;

export function buildTargets(orm: MikroORM, own: SandboxRuntime, runners: RunnerDirectory | undefined): BuildTargets {
  const runner = async (runnerId: string) => {
    if (runnerId === own.runnerId) return { runnerId, runtime: own };
    const runtime = await runners?.runtime(runnerId);
    if (!runtime) throw errors.unavailable(`The runner ${runnerId} is not registered any more`);
    return { runnerId, runtime };
  };
  return async (organizationId, where) => {
    if (where.runnerId) return runner(where.runnerId);
    // No region given and none by default: this host (as before runners).
    const regionId = where.regionId ?? (await targetRegion(orm, organizationId, undefined).catch(() => undefined));
    if (regionId && runners?.builder && (await runners.servesRegion(regionId))) return runner(await runners.builder(regionId, where.need ?? { cpu: 1, memory: 1, disk: 1 }));
    await own.assertReady();
    return { runnerId: own.runnerId, runtime: own };
  };
}
