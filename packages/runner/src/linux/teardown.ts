import { access, rm } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { mountPoints, mountsUnder, unmount } from "../host/mounts.ts";
import type { SandboxHost } from "../host/sandbox-host.ts";
import type { CgroupBackend } from "./cgroups/types.ts";
import type { LeftoverTally } from "./leftovers.ts";
import type { MeminfoRefresher } from "./meminfo-refresher.ts";
import { endSandboxProcesses } from "./terminate.ts";

// The end of a linux sandbox's run: what a stop, a failed start, a destroy and the leftovers
// sweep all undo, in that order: processes, cgroup, mounts, network, runtime dir.

/** What a teardown reaches of the provider. */
interface Torn {
  host: SandboxHost;
  cgroups: CgroupBackend;
  meminfo: MeminfoRefresher;
}

const exists = (p: string) => access(p).then(() => true, () => false);

/**
 * Kills the sandbox's processes, removes its cgroup, mounts and runtime dir. Idempotent.
 * `idle`: the caller just saw the cgroup empty (a start), so there is nothing to kill.
 * `tally`: counts what was there (leftovers; a few more reads, so only for them).
 */
export async function tearDown(p: Torn, id: string, graceMs = 0, idle = false, tally?: LeftoverTally): Promise<void> {
  const { host, cgroups, meminfo } = p;
  const L = host.layout;
  if (tally) {
    if (!idle) tally.add("processes", (await cgroups.pids(id)).length);
    if ((await Promise.all(cgroups.paths(id).map(exists))).some(Boolean)) tally.add("cgroups");
  }
  // A paused sandbox is thawed first: its processes must see the polite SIGTERM to act on it.
  if (!idle && (await cgroups.frozen(id))) await cgroups.thaw(id);
  if (!idle) await endSandboxProcesses(cgroups, id, graceMs);
  meminfo.untrack(id);
  await cgroups.remove(id);
  // One read of the mount table; read again only to check what was unmounted is gone.
  const table = await mountPoints();
  const runtimeMounts = table.filter((m) => m === L.runtime(id) || m.startsWith(L.runtime(id) + "/"));
  const volumesDir = path.join(L.runtime(id), "volumes") + "/";
  const unmountCounted = async (target: string) => {
    await unmount(target);
    tally?.add("mounts");
  };
  if (runtimeMounts.includes(L.rootMount(id))) await unmountCounted(L.rootMount(id));
  if (table.includes(L.diskMount(id))) await unmountCounted(L.diskMount(id));
  for (const m of runtimeMounts.filter((x) => x.startsWith(volumesDir)).reverse()) await unmountCounted(m);
  if (tally) await host.networks.removeLeftover(await host.readLease(id), id, (kind) => tally.add(kind));
  else await host.networks.tearDown(await host.readLease(id), id);
  const left = runtimeMounts.length > 0 ? await mountsUnder(L.runtime(id)) : [];
  if (left.length > 0) throw errors.internal(`sandbox ${id}: still mounted after stop: ${left.join(", ")}`);
  await rm(L.runtime(id), { recursive: true, force: true });
}
