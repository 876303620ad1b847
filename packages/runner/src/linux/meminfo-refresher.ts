import { open, readFile, type FileHandle } from "node:fs/promises";
import type { CgroupBackend } from "./cgroups/types.ts";
import { meminfoTemplate, renderMeminfo, type MeminfoTemplate } from "./meminfo.ts";

// Keeps the meminfo file of every running sandbox (bound read-only over its /proc/meminfo)
// current: one timer for all of them; each tick reads the sandbox group's memory (2-3 cgroupfs
// reads) and writes the whole file with one pwrite at offset 0. Every rendering has the same
// length, so the file is never truncated and a reader never sees it short.

export interface MeminfoRefresherOptions {
  cgroups: CgroupBackend;
  /** Time between refreshes; default 1 s. */
  intervalMs?: number;
  log?: (line: string) => void;
}

interface Tracked {
  handle: FileHandle;
  /** The refresh in progress, awaited before the handle is closed. */
  busy: Promise<void>;
}

export class MeminfoRefresher {
  readonly #cgroups: CgroupBackend;
  readonly #template: MeminfoTemplate;
  readonly #intervalMs: number;
  readonly #log: (line: string) => void;
  readonly #tracked = new Map<string, Tracked>();
  #timer: NodeJS.Timeout | undefined;
  #ticking = false;

  private constructor(template: MeminfoTemplate, options: MeminfoRefresherOptions) {
    this.#cgroups = options.cgroups;
    this.#template = template;
    this.#intervalMs = options.intervalMs ?? 1000;
    this.#log = options.log ?? (() => undefined);
  }

  static async open(options: MeminfoRefresherOptions): Promise<MeminfoRefresher> {
    return new MeminfoRefresher(meminfoTemplate(await readFile("/proc/meminfo", "utf8")), options);
  }

  /** Sandboxes whose file is kept current. */
  tracked(): string[] {
    return [...this.#tracked.keys()];
  }

  /** Writes a new sandbox's file (to bind at its start) and keeps it current until untrack. */
  async create(id: string, file: string): Promise<void> {
    await this.untrack(id);
    const handle = await open(file, "w", 0o444);
    await this.#add(id, handle);
  }

  /**
   * Keeps the file of a sandbox started by an earlier runner current. One of another length (a
   * host whose memory changed since) is left as it is: rewriting it shorter would leave a tail.
   */
  async adopt(id: string, file: string): Promise<boolean> {
    const handle = await open(file, "r+").catch(() => undefined);
    if (!handle) return false;
    if ((await handle.stat()).size !== this.#template.length) {
      await handle.close();
      this.#log(`sandbox ${id}: its /proc/meminfo view has another layout; it is refreshed again after its next start`);
      return false;
    }
    await this.untrack(id);
    await this.#add(id, handle);
    return true;
  }

  async #add(id: string, handle: FileHandle): Promise<void> {
    const entry: Tracked = { handle, busy: Promise.resolve() };
    try {
      await this.#refresh(id, entry);
    } catch (err) {
      await handle.close();
      throw err;
    }
    this.#tracked.set(id, entry);
    this.#timer ??= setInterval(() => void this.#tick(), this.#intervalMs).unref();
  }

  /** Stops refreshing the sandbox's file (its stop or destroy removes the file). */
  async untrack(id: string): Promise<void> {
    const entry = this.#tracked.get(id);
    if (!entry) return;
    this.#tracked.delete(id);
    await entry.busy;
    await entry.handle.close();
    if (this.#tracked.size === 0) this.#stopTimer();
  }

  /** Refreshes every tracked file once; what ticks do (tests and benchmarks call it directly). */
  async refreshAll(): Promise<void> {
    await Promise.all(
      [...this.#tracked].map(([id, entry]) => {
        entry.busy = this.#refresh(id, entry).catch((err: unknown) => this.#log(`sandbox ${id}: /proc/meminfo view: ${(err as Error).message}`));
        return entry.busy;
      }),
    );
  }

  async #tick(): Promise<void> {
    if (this.#ticking) return; // a slow tick (a loaded host) is not stacked on
    this.#ticking = true;
    try {
      await this.refreshAll();
    } finally {
      this.#ticking = false;
    }
  }

  async #refresh(id: string, entry: Tracked): Promise<void> {
    const use = await this.#cgroups.memory(id);
    if (!use) return; // group gone: the sandbox died and its next start or stop untracks it
    const text = Buffer.from(renderMeminfo(this.#template, use));
    await entry.handle.write(text, 0, text.length, 0);
  }

  /** Stops the timer and closes the files; sandboxes keep running (the next runner adopts them). */
  async close(): Promise<void> {
    this.#stopTimer();
    await Promise.all(this.tracked().map((id) => this.untrack(id)));
  }

  #stopTimer(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
