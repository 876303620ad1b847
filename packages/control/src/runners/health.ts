import type { MikroORM } from "@mikro-orm/postgresql";
import type { SecretBox } from "../auth/secret-box.ts";
import { execIn } from "../db/exec.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerRow, RUNNER_COLUMNS } from "./rows.ts";
import { StraySweep } from "./stray-sweep.ts";

// Control asks each registered runner how it is (RunnerService.GetRunnerInfo at its apiUrl, with
// its credential) on a timer: an answer makes it `ready` (or `unresponsive` when it reports an
// unhealthy service) with its capacity and load; no answer for `unresponsiveMs` makes it
// `unresponsive`. Every control process probes: the updates are idempotent. A ready runner's
// sandboxes the database does not claim are removed after a grace period (stray-sweep.ts).

export interface RunnerHealthOptions {
  intervalMs: number;
  unresponsiveMs: number;
  /** Sandboxes a ready runner holds unknown to the database are removed after this long (stray-sweep.ts). */
  strayGraceMs?: number;
  log?: (line: string) => void;
}

const PROBE_TIMEOUT_MS = 3000;

export class RunnerHealth {
  readonly #orm: MikroORM;
  readonly #box: SecretBox;
  readonly #o: RunnerHealthOptions;
  readonly #clients = new Map<string, { url: string; sealed: string; runtime: Promise<RemoteRuntime> }>();
  #timer: NodeJS.Timeout | undefined;
  readonly #strays: StraySweep;
  #running: Promise<void> | undefined;

  constructor(orm: MikroORM, box: SecretBox, o: RunnerHealthOptions) {
    this.#orm = orm;
    this.#box = box;
    this.#o = o;
    this.#strays = new StraySweep(orm, o.strayGraceMs ?? 300_000, o.log);
  }

  start(): void {
    const tick = () => {
      this.#running = this.checkAll()
        .catch((err: unknown) => this.#o.log?.(`runner checks: ${err instanceof Error ? err.message : String(err)}`))
        .finally(() => {
          this.#running = undefined;
          if (this.#timer) this.#timer = setTimeout(tick, this.#o.intervalMs).unref();
        });
    };
    this.#timer = setTimeout(tick, 0).unref();
  }

  /** One round: every runner that has an address and is not decommissioned. */
  async checkAll(): Promise<void> {
    const exec = execIn(this.#orm.em.fork());
    const rows = (await exec(`select ${RUNNER_COLUMNS} from runner where api_url is not null and state <> 'decommissioned'`, [])) as RunnerRow[];
    await Promise.all(rows.map((r) => this.check(r)));
  }

  async check(r: RunnerRow): Promise<void> {
    const exec = execIn(this.#orm.em.fork());
    try {
      const runtime = await this.#runtime(r);
      const info = await runtime.info();
      // What it holds, for placement; a runner that cannot list its images keeps what was known.
      const held = await runtime.heldImages().catch(() => undefined);
      const sick = info.services.find((s) => !s.healthy);
      const gib = (mib: number) => Math.floor(mib / 1024);
      await exec(
        `update runner set state = ?, state_reason = ?, last_checked = now(), updated_at = now(), runner_key = ?, app_version = ?,
           cpu = ?, memory_gib = ?, disk_gib = ?, cpu_usage = ?, memory_usage = ?, disk_usage = ?, started_sandboxes = ?, snapshot_count = ?,
           gpu = ?, gpu_type = ?, shared_volumes = ?, held_images = case when ?::jsonb is null then held_images else array(select jsonb_array_elements_text(?::jsonb)) end
         where id = ? and state <> 'decommissioned'`,
        [
          sick ? "unresponsive" : "ready",
          sick ? sick.reason || `${sick.name} is unhealthy` : null,
          info.id,
          info.version,
          Math.floor((info.capacity?.cpuMillicores ?? 0) / 1000),
          gib(info.capacity?.memoryMib ?? 0),
          gib(info.capacity?.diskMib ?? 0),
          info.usage?.cpuPercent ?? 0,
          info.usage?.memoryPercent ?? 0,
          info.usage?.diskPercent ?? 0,
          info.startedSandboxCount,
          held?.length ?? info.snapshotCount,
          // Its GPUs as it found them (or was told): placement counts these.
          info.capacity?.gpu ?? 0,
          info.capacity?.gpu ? info.gpuType || null : null,
          info.sharedVolumes,
          held ? JSON.stringify(held) : null,
          held ? JSON.stringify(held) : null,
          r.id,
        ],
      );
      if (!sick) await this.#strays.sweep(info.id, runtime).catch((err: unknown) => this.#o.log?.(`runner ${r.name}: stray sweep: ${err instanceof Error ? err.message : String(err)}`));
    } catch (err) {
      if (r.runner_key) this.#strays.forget(r.runner_key);
      void this.#forget(r.id);
      const reason = err instanceof Error ? err.message : String(err);
      // Silent for unresponsiveMs since its last answer (or its registration): then unresponsive.
      await exec(
        `update runner set state = 'unresponsive', state_reason = ?, updated_at = now()
          where id = ? and state not in ('decommissioned', 'unresponsive') and coalesce(last_checked, created_at) < now() - (?::int * interval '1 millisecond')`,
        [`no answer from ${r.api_url}: ${reason}`, r.id, this.#o.unresponsiveMs],
      );
    }
  }

  #runtime(r: RunnerRow): Promise<RemoteRuntime> {
    const known = this.#clients.get(r.id);
    if (known && known.url === r.api_url && known.sealed === r.credential_sealed) return known.runtime;
    if (known) void this.#forget(r.id);
    const runtime = RemoteRuntime.open({ url: r.api_url!, credential: this.#box.open(r.credential_sealed), timeoutMs: PROBE_TIMEOUT_MS });
    this.#clients.set(r.id, { url: r.api_url!, sealed: r.credential_sealed, runtime });
    return runtime;
  }

  #forget(id: string): Promise<void> {
    const known = this.#clients.get(id);
    this.#clients.delete(id);
    return known ? known.runtime.then((rt) => rt.close(), () => undefined) : Promise.resolve();
  }

  async stop(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#running;
    await Promise.all([...this.#clients.keys()].map((id) => this.#forget(id)));
  }
}
