import { closeSync, fstatSync, openSync, writeSync } from "node:fs";
import { readFile } from "node:fs/promises";
import type { CgroupBackend } from "./cgroups/types.ts";
import { meminfoTemplate, renderMeminfo, type MeminfoTemplate } from "./meminfo.ts";

// Keeps the meminfo file of every running sandbox (bound read-only over its /proc/meminfo)
// current: one timer for all of them; each tick reads the sandbox group's memory (2-3 cgroupfs
// files) and writes the whole file with one pwrite at offset 0. Every rendering has the same
// length, so the file is never truncated and a reader never sees it short. The I/O is blocking
// on purpose: ~25 µs of CPU per sandbox, where the async calls cost ~200 µs (thread pool hops).

export interface MeminfoRefresherOptions {
  cgroups: CgroupBackend;
  /** Time between refreshes; default 1 s. */
  intervalMs?: number;
  log?: (line: string) => void;
}

export class MeminfoRefresher {
  readonly #cgroups: CgroupBackend;
  readonly #template: MeminfoTemplate;
  readonly #intervalMs: number;
  readonly #log: (line: string) => void;
  /** Sandbox id -> descriptor of its file, open while it is tracked. */
  readonly #tracked = new Map<string, number>();
  #timer: NodeJS.Timeout | undefined;

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
  create(id: string, file: string): void {
    this.untrack(id);
    this.#add(id, openSync(file, "w", 0o444));
  }

  /**
   * Keeps the file of a sandbox started by an earlier runner current. One of another length (a
   * host whose memory changed since) is left as it is: rewriting it shorter would leave a tail.
   */
  adopt(id: string, file: string): boolean {
    let fd: number;
    try {
      fd = openSync(file, "r+");
    } catch {
      return false; // started before views existed
    }
    if (fstatSync(fd).size !== this.#template.length) {
      closeSync(fd);
      this.#log(`sandbox ${id}: its /proc/meminfo view has another layout; it is refreshed again after its next start`);
      return false;
    }
    this.untrack(id);
    this.#add(id, fd);
    return true;
  }

  #add(id: string, fd: number): void {
    try {
      this.#refresh(id, fd);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
    this.#tracked.set(id, fd);
    this.#timer ??= setInterval(() => this.refreshAll(), this.#intervalMs).unref();
  }

  /** Stops refreshing the sandbox's file (its stop or destroy removes the file). */
  untrack(id: string): void {
    const fd = this.#tracked.get(id);
    if (fd === undefined) return;
    this.#tracked.delete(id);
    closeSync(fd);
    if (this.#tracked.size === 0) this.#stopTimer();
  }

  /** Refreshes every tracked file once: what a tick does (benchmarks call it directly). */
  refreshAll(): void {
    for (const [id, fd] of this.#tracked) {
      try {
        this.#refresh(id, fd);
      } catch (err) {
        this.#log(`sandbox ${id}: /proc/meminfo view: ${(err as Error).message}`);
      }
    }
  }

  #refresh(id: string, fd: number): void {
    const use = this.#cgroups.memory(id);
    if (!use) return; // group gone: the sandbox died; its next start or stop untracks it
    const text = Buffer.from(renderMeminfo(this.#template, use));
    writeSync(fd, text, 0, text.length, 0);
  }

  /** Stops the timer and closes the files; sandboxes keep running (the next runner adopts them). */
  close(): void {
    this.#stopTimer();
    for (const id of this.tracked()) this.untrack(id);
  }

  #stopTimer(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
