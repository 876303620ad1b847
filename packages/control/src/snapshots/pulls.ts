import { Code, ConnectError } from "@sandbar/protocol";
import { DOCKER_HUB, type ImageStore, parseImageRef } from "@sandbar/runner/images";
import type { Builder } from "../builds/builder.ts";
import type { CredentialsFor } from "./credentials-for.ts";
import type { SnapshotRow, SnapshotStore } from "./store.ts";

// Pulls of snapshot images, in the background on this host's image store: pending -> pulling ->
// active (ref, size, entrypoint from the image) or error (errorReason); declarative builds the
// same way: pending -> building -> active or build_failed (the builder's last lines). The store's lock makes
// concurrent pulls of one image a single pull. Each pull's progress lines are its build log: kept
// in memory while it runs (followers wait on it), written to the row when it ends.

// Kept here too for the callers that name it with the pulls (server, sandbox boot).
export type { CredentialsFor } from "./credentials-for.ts";

export interface PullSettings {
  /** SANDBAR_REGISTRY_MIRROR: host[:port] serving Docker Hub's repositories. */
  mirror?: string;
  /** Maximum image size in GB when the organization sets none (the reference's default 20). */
  defaultMaxSizeGb?: number;
}

/** A build log: lines so far, whether it ended, and who waits for more. */
export class BuildLog {
  readonly lines: string[] = [];
  done = false;
  #waiters = new Set<() => void>();

  push(line: string): void {
    this.lines.push(line);
    this.#wake();
  }

  end(): void {
    this.done = true;
    this.#wake();
  }

  /** Resolves at the next line or the end (or when `signal` aborts). */
  changed(signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.#waiters.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      this.#waiters.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  /** The log from its start as chunks of lines; with `follow`, until it ends (or `signal` aborts). */
  async *follow(follow: boolean, signal: AbortSignal): AsyncGenerator<{ data: Uint8Array }> {
    let sent = 0;
    for (;;) {
      if (sent < this.lines.length) {
        const lines = this.lines.slice(sent);
        sent += lines.length;
        yield { data: new TextEncoder().encode(lines.join("\n") + "\n") };
        continue;
      }
      if (this.done || !follow) return;
      await this.changed(signal);
      if (signal.aborted) return;
    }
  }

  #wake(): void {
    for (const w of [...this.#waiters]) w();
  }
}

const GB = 1e9;

export class SnapshotPulls {
  readonly #store: SnapshotStore;
  readonly #images: () => Promise<ImageStore>;
  readonly #credentialsFor: CredentialsFor;
  readonly #settings: PullSettings;
  readonly #log: (line: string) => void;
  readonly #running = new Map<string, { log: BuildLog; abort: AbortController; done: Promise<void> }>();
  readonly #maxSizeGb: (organizationId: string) => Promise<number | null>;
  readonly #builder: Builder | undefined;

  constructor(o: { store: SnapshotStore; images: () => Promise<ImageStore>; credentialsFor: CredentialsFor; settings: PullSettings; maxSizeGb: (organizationId: string) => Promise<number | null>; log: (line: string) => void; builder?: Builder }) {
    this.#builder = o.builder;
    this.#store = o.store;
    this.#images = o.images;
    this.#credentialsFor = o.credentialsFor;
    this.#settings = o.settings;
    this.#maxSizeGb = o.maxSizeGb;
    this.#log = o.log;
  }

  /** Starts the pull of a `pending` snapshot in the background. */
  start(row: SnapshotRow): void {
    if (this.#running.has(row.id)) return;
    const log = new BuildLog();
    const abort = new AbortController();
    const done = this.#pull(row, log, abort.signal)
      .catch((err: unknown) => this.#log(`snapshot ${row.id}: ${err instanceof Error ? err.message : String(err)}`))
      .finally(() => {
        log.end();
        this.#running.delete(row.id);
      });
    this.#running.set(row.id, { log, abort, done });
  }

  /** After a restart: every snapshot left pending or pulling is pulled again (the store resumes). */
  async resume(): Promise<number> {
    const rows = await this.#store.unfinished();
    for (const row of rows) {
      const again = await this.#store.update(row.id, { state: "pending", errorReason: null }, ["pending", "pulling", "building"]);
      if (again) this.start(again);
    }
    return rows.length;
  }

  /** The running pull's log, if one runs. */
  live(id: string): BuildLog | undefined {
    return this.#running.get(id)?.log;
  }

  /** Stops the pull of a snapshot (it is being removed) and waits for it to end. */
  async cancel(id: string): Promise<void> {
    const r = this.#running.get(id);
    if (!r) return;
    r.abort.abort();
    await r.done;
  }

  /** Waits for running pulls to end (they are interrupted: a restart resumes them). */
  async close(): Promise<void> {
    const all = [...this.#running.values()];
    for (const r of all) r.abort.abort();
    await Promise.all(all.map((r) => r.done));
  }

  async #pull(row: SnapshotRow, log: BuildLog, signal: AbortSignal): Promise<void> {
    const info = row.buildInfo;
    const running = info ? "building" : "pulling";
    const started = await this.#store.update(row.id, { state: running }, ["pending"]);
    if (!started) return;
    let state: "active" | "error" | "build_failed" = info ? "build_failed" : "error";
    let patch: Parameters<SnapshotStore["update"]>[1] = {};
    try {
      let image: { digest: string; size: number; config: { entrypoint: string[]; cmd: string[] } };
      if (info) {
        if (!this.#builder || !row.organizationId) throw new Error("Declarative builds are not available on this server");
        const need = { cpu: row.cpu, memory: row.mem, disk: row.disk };
        const built = await this.#builder.build(row.organizationId, info, { signal, onProgress: (l) => log.push(l), where: { regionId: info.regionId, need }, onRunner: (r) => this.#store.buildingOn(row.id, r) });
        image = { digest: built.digest, size: built.size, config: { entrypoint: built.entrypoint, cmd: built.cmd } };
      } else {
        const ref = parseImageRef(row.imageName);
        const registry = ref.registry === DOCKER_HUB && this.#settings.mirror ? this.#settings.mirror : ref.registry;
        const credentials = row.organizationId ? await this.#credentialsFor(row.organizationId, registry) : undefined;
        image = await (await this.#images()).pull(row.imageName, { credentials, signal, onProgress: (l) => log.push(l) });
      }
      const size = image.size / GB;
      const max = (row.organizationId ? await this.#maxSizeGb(row.organizationId) : null) ?? this.#settings.defaultMaxSizeGb ?? 20;
      if (size > max) throw new Error(`Snapshot size (${size.toFixed(2)}GB) exceeds maximum allowed size of ${max}GB`);
      // A build without ENTRYPOINT or CMD sleeps, as the reference's builds do.
      const entrypoint = row.entrypoint.length ? row.entrypoint : image.config.entrypoint.length ? image.config.entrypoint : image.config.cmd.length || !info ? image.config.cmd : ["sleep", "infinity"];
      log.push(`image ${image.digest} ready (${image.size} bytes)`);
      state = "active";
      patch = { ref: image.digest, size: Math.round(size * 1e6) / 1e6, entrypoint, errorReason: null };
    } catch (err) {
      if (signal.aborted) {
        // Removed meanwhile (the row is going) or the server is stopping (a restart resumes it).
        log.push("pull interrupted");
        await this.#store.update(row.id, { buildLog: log.lines.join("\n") + "\n" });
        return;
      }
      const reason = err instanceof ConnectError ? err.rawMessage : err instanceof Error ? err.message : String(err);
      log.push(`error: ${reason}`);
      patch = { errorReason: reason };
      if (err instanceof ConnectError && err.code === Code.Internal) this.#log(`snapshot ${row.id}: pull failed: ${reason}`);
    }
    await this.#store.update(row.id, { ...patch, state, buildLog: log.lines.join("\n") + "\n" }, [running]);
  }
}
