import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { SecretBox } from "../auth/secret-box.ts";
import { type Exec, execIn } from "../db/exec.ts";
import type { Placement, PlacementNeed, RunnerDirectory } from "../sandboxes/manager.ts";
import { DEFAULT_CLASS, noAvailableRunners, runnerClassFor } from "../sandboxes/sandbox-class.ts";
import type { SandboxRuntime } from "../sandboxes/runtime.ts";
import { RemoteRuntime } from "./remote-runtime.ts";

// The registered runners as the sandbox manager sees them: a RemoteRuntime per runner (by the
// id its sandboxes record), and placement. A create in a region with registered runners takes,
// among the runners that are ready, schedulable, not draining, of its class and have room for it
// (GPUs counted like CPUs; runners with GPUs take only GPU sandboxes; with volumes: runners that
// mount them from the shared volume root), of its first preferred GPU model, one already holding its image
// (held_images) first, then the one with the most free CPU; free = what the runner reported
// minus the sandboxes that hold it (every sandbox on it but archived and destroyed ones). The region's runner rows are locked for the
// insert's transaction, so two control processes placing at once see each other's sandboxes.

export class RegisteredRunners implements RunnerDirectory {
  readonly #orm: MikroORM;
  readonly #box: SecretBox;
  readonly #runtimes = new Map<string, { url: string; sealed: string; runtime: Promise<RemoteRuntime> }>();
  #silent: { keys: ReadonlySet<string>; until: number } | undefined;

  constructor(orm: MikroORM, box: SecretBox) {
    this.#orm = orm;
    this.#box = box;
  }

  #exec(): Exec {
    return execIn(this.#orm.em.fork());
  }

  async runtime(runnerId: string): Promise<SandboxRuntime | undefined> {
    const rows = (await this.#exec()(`select api_url, credential_sealed from runner where runner_key = ? and api_url is not null`, [runnerId])) as Array<{ api_url: string; credential_sealed: string }>;
    const row = rows[0];
    if (!row) return undefined;
    const known = this.#runtimes.get(runnerId);
    if (known && known.url === row.api_url && known.sealed === row.credential_sealed) {
      const rt = await known.runtime.catch(() => undefined);
      if (rt) return rt;
    }
    // A runner whose address or credential changed: its old client goes.
    if (known) void known.runtime.then((rt) => rt.close(), () => undefined);
    const runtime = RemoteRuntime.open({ url: row.api_url, credential: this.#box.open(row.credential_sealed) });
    this.#runtimes.set(runnerId, { url: row.api_url, sealed: row.credential_sealed, runtime });
    try {
      return await runtime;
    } catch (err) {
      this.#runtimes.delete(runnerId);
      throw errors.unavailable(`The runner holding this sandbox cannot be reached: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  async servesRegion(regionId: string): Promise<boolean> {
    return ((await this.#exec()(`select 1 from runner where region_id = ? limit 1`, [regionId])) as unknown[]).length > 0;
  }

  async place(exec: Exec, regionId: string, need: PlacementNeed): Promise<Placement | undefined> {
    const volumes = (need.volumes?.length ?? 0) > 0;
    const types = need.gpu > 0 ? [...(need.gpuTypes ?? [])] : [];
    const all = (await exec(`select id from runner where region_id = ? order by id for update`, [regionId])) as unknown[];
    if (!all.length) return undefined;
    const rows = await candidates(exec, regionId, need);
    if (!rows[0] && volumes && !((await exec(`select 1 from runner where region_id = ? and shared_volumes limit 1`, [regionId])) as unknown[]).length) {
      throw errors.invalidArgument("Volumes cannot be mounted in this region: none of its runners has a shared volume root (SANDBAR_VOLUME_ROOT)");
    }
    // The reference's answer when no runner of the region can take it.
    if (!rows[0]) throw noAvailableRunners(types);
    return { runnerId: rows[0].runner_key, gpuType: need.gpu > 0 ? rows[0].gpu_type : null };
  }

  /** A runner of the region to run a build: picked as a create's (no lock: a build reserves no capacity). */
  async builder(regionId: string, need: { cpu: number; memory: number; disk: number }): Promise<string> {
    const rows = await candidates(this.#exec(), regionId, need);
    if (!rows[0]) throw errors.invalidArgument("No available runners to run the build");
    return rows[0].runner_key;
  }

  async holds(runnerId: string, digest: string): Promise<void> {
    await this.#exec()(`update runner set held_images = array_append(held_images, ?) where runner_key = ? and not held_images @> array[?]::text[]`, [digest, runnerId, digest]);
  }

  /** Removes an image no sandbox uses any more from every runner recorded as holding it; a runner that cannot is logged and keeps it. */
  async dropImage(digest: string, log: (line: string) => void = () => undefined): Promise<void> {
    const rows = (await this.#exec()(`select runner_key from runner where held_images @> array[?]::text[] and runner_key is not null`, [digest])) as Array<{ runner_key: string }>;
    for (const { runner_key: key } of rows) {
      try {
        const rt = await this.runtime(key);
        await rt?.removeImage?.(digest);
        await this.#exec()(`update runner set held_images = array_remove(held_images, ?) where runner_key = ?`, [digest, key]);
      } catch (err) {
        log(`runner ${key}: removing image ${digest} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  }

  async ready(): Promise<string[]> {
    const rows = (await this.#exec()(`select runner_key from runner where state = 'ready' and runner_key is not null`, [])) as Array<{ runner_key: string }>;
    return rows.map((r) => r.runner_key);
  }

  async unresponsive(): Promise<ReadonlySet<string>> {
    // Read on every sandbox read: kept for a second.
    if (this.#silent && this.#silent.until > Date.now()) return this.#silent.keys;
    const rows = (await this.#exec()(`select runner_key from runner where state = 'unresponsive' and runner_key is not null`, [])) as Array<{ runner_key: string }>;
    this.#silent = { keys: new Set(rows.map((r) => r.runner_key)), until: Date.now() + 1000 };
    return this.#silent.keys;
  }

  async close(): Promise<void> {
    const all = [...this.#runtimes.values()];
    this.#runtimes.clear();
    await Promise.allSettled(all.map(({ runtime }) => runtime.then((rt) => rt.close())));
  }
}

/** The region's runners that can take `need`: ready, schedulable, not draining, with room; a holder of its image first, then the most free CPU. */
function candidates(exec: Exec, regionId: string, need: Omit<PlacementNeed, "gpu" | "sandboxClass"> & Partial<Pick<PlacementNeed, "gpu" | "sandboxClass">>): Promise<Array<{ runner_key: string; gpu_type: string | null }>> {
  const volumes = (need.volumes?.length ?? 0) > 0;
  const gpu = need.gpu ?? 0;
  const typesJson = JSON.stringify(gpu > 0 ? [...(need.gpuTypes ?? [])] : []); // a list parameter would be spread into `?, ?`
  // GPUs count like cpu and memory; a runner with GPUs takes only GPU sandboxes (the reference's rule),
  // of its class, and of a model the create accepts (its first preference that has room).
  return exec(
    `select r.runner_key, r.gpu_type from runner r
       left join sandbox s on s.runner_id = r.runner_key and s.state not in ('archived', 'destroyed')
      where r.region_id = ? and r.state = 'ready' and not r.unschedulable and not r.draining and r.runner_key is not null and (r.shared_volumes or not ?)
        and r.sandbox_class = ? and (coalesce(r.gpu, 0) > 0) = (?::int > 0) and (jsonb_array_length(?::jsonb) = 0 or r.gpu_type = any(array(select jsonb_array_elements_text(?::jsonb))))
      group by r.id
     having r.cpu - coalesce(sum(s.cpu), 0) >= ? and r.memory_gib - coalesce(sum(s.memory), 0) >= ? and r.disk_gib - coalesce(sum(s.disk), 0) >= ?
        and coalesce(r.gpu, 0) - coalesce(sum(s.gpu), 0) >= ?
      order by array_position(array(select jsonb_array_elements_text(?::jsonb)), r.gpu_type::text), r.held_images @> array[?]::text[] desc, r.cpu - coalesce(sum(s.cpu), 0) desc, r.memory_gib - coalesce(sum(s.memory), 0) desc, r.id
      limit 1`,
    [regionId, volumes, runnerClassFor(need.sandboxClass ?? DEFAULT_CLASS), gpu, typesJson, typesJson, need.cpu, need.memory, need.disk, gpu, typesJson, need.imageRef ?? ""],
  ) as Promise<Array<{ runner_key: string; gpu_type: string | null }>>;
}
