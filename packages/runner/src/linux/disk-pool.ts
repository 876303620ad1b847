import { randomBytes } from "node:crypto";
import { mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { isErrno } from "../host/files.ts";
import { makeDiskImage } from "./mounts.ts";

// Disk images formatted ahead of need. mkfs.ext4 of a sandbox's image is 10-30 ms of a cold
// create; a few images per size are kept ready under `<dir>/<bytes>/` and one is renamed into the
// new sandbox's dir (rename: atomic and exclusive, so an image is claimed by one sandbox only,
// even with two runner processes on one data dir). Images are formatted under a dot name in
// the same directory and renamed when complete, so a crash leaves only dot names, which open()
// removes; a ready name is always a whole filesystem that no sandbox has used. The pool is
// bounded: `perSize` images for each of the last `maxSizes` sizes asked for; refills run one
// mkfs at a time, at the lowest CPU priority, from `refillDelayMs` after a claim (the start that
// usually follows a create goes first).

export interface DiskPoolOptions {
  /** Ready images kept per size; 0 turns the pool off (every create formats its own). */
  perSize: number;
  /** Sizes kept; the least recently asked for is dropped first. */
  maxSizes: number;
  refillDelayMs: number;
  log: (line: string) => void;
}

const DISK_POOL_DEFAULTS: Omit<DiskPoolOptions, "log"> = { perSize: 4, maxSizes: 4, refillDelayMs: 200 };

const READY = /^[0-9a-f]{16}\.img$/;

export class DiskImagePool {
  readonly dir: string;
  readonly #o: DiskPoolOptions;
  /** Sizes wanted, least recently asked for first (Map keeps insertion order). */
  readonly #sizes = new Map<number, true>();
  #timer: NodeJS.Timeout | undefined;
  #refilling: Promise<void> | undefined;
  #closed = false;
  /** Set when a claim met another filesystem (EXDEV): renames cannot serve this data dir. */
  #off = false;

  private constructor(dir: string, options: DiskPoolOptions) {
    this.dir = dir;
    this.#o = options;
  }

  /** Opens the pool: half-made images of a crash removed, sizes beyond the bounds dropped, the rest refilled. */
  static async open(dir: string, options: Partial<DiskPoolOptions> = {}): Promise<DiskImagePool> {
    const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
    const pool = new DiskImagePool(dir, { ...DISK_POOL_DEFAULTS, log: () => undefined, ...given });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const found: { bytes: number; mtime: number }[] = [];
    for (const name of await readdir(dir)) {
      const sub = path.join(dir, name);
      const bytes = /^[1-9][0-9]{0,15}$/.test(name) ? Number(name) : undefined;
      if (bytes === undefined || pool.#o.perSize === 0) {
        await rm(sub, { recursive: true, force: true });
        continue;
      }
      for (const img of await readdir(sub)) if (!READY.test(img)) await rm(path.join(sub, img), { recursive: true, force: true });
      found.push({ bytes, mtime: (await stat(sub)).mtimeMs });
    }
    found.sort((a, b) => a.mtime - b.mtime);
    for (const { bytes } of found.slice(0, Math.max(0, found.length - pool.#o.maxSizes))) await rm(path.join(dir, String(bytes)), { recursive: true, force: true });
    for (const { bytes } of found.slice(-pool.#o.maxSizes)) pool.#sizes.set(bytes, true);
    if (pool.#sizes.size > 0) pool.#schedule(0);
    return pool;
  }

  /** Puts a formatted image of `bytes` at `target` (which must not exist): a ready one when there is one. */
  async claim(target: string, bytes: number): Promise<void> {
    if (this.#o.perSize > 0 && !this.#off) {
      this.#want(bytes);
      for (const name of await this.#ready(bytes)) {
        try {
          await rename(path.join(this.#sizeDir(bytes), name), target);
          this.#schedule(this.#o.refillDelayMs);
          return;
        } catch (err) {
          if (isErrno(err, "EXDEV")) {
            // The sandboxes live on another filesystem than the pool: it cannot serve them.
            this.#o.log(`disk image pool: ${this.dir} is not on the filesystem of ${path.dirname(target)}; turned off, creates format their images`);
            this.#off = true;
            break;
          }
          if (!isErrno(err, "ENOENT")) throw err; // claimed by another runner process: try the next
        }
      }
      this.#schedule(this.#o.refillDelayMs);
    }
    await makeDiskImage(target, bytes);
  }

  /** Resolves once no refill is pending or running (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.#timer !== undefined || this.#refilling !== undefined) {
      if (this.#refilling) await this.#refilling;
      else await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Stops refilling and waits for a running mkfs; the ready images stay for the next open. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#refilling;
  }

  #sizeDir(bytes: number): string {
    return path.join(this.dir, String(bytes));
  }

  async #ready(bytes: number): Promise<string[]> {
    try {
      return (await readdir(this.#sizeDir(bytes))).filter((n) => READY.test(n));
    } catch (err) {
      if (isErrno(err, "ENOENT")) return [];
      throw err;
    }
  }

  #want(bytes: number): void {
    this.#sizes.delete(bytes);
    this.#sizes.set(bytes, true);
    for (const old of this.#sizes.keys()) {
      if (this.#sizes.size <= this.#o.maxSizes) break;
      this.#sizes.delete(old);
      // A refill of that size in flight finds its directory gone and stops.
      void rm(this.#sizeDir(old), { recursive: true, force: true }).catch(() => undefined);
    }
  }

  #schedule(ms: number): void {
    if (this.#closed || this.#off || this.#timer !== undefined) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (this.#refilling || this.#closed) return this.#schedule(this.#o.refillDelayMs);
      this.#refilling = this.#refill()
        .catch((err: unknown) => this.#o.log(`disk image pool: refill failed: ${String(err)}`))
        .finally(() => (this.#refilling = undefined));
    }, ms);
    this.#timer.unref();
  }

  async #refill(): Promise<void> {
    for (const bytes of [...this.#sizes.keys()].reverse()) {
      const dir = this.#sizeDir(bytes);
      await mkdir(dir, { recursive: true, mode: 0o700 });
      while (!this.#closed && !this.#off && this.#sizes.has(bytes) && (await this.#ready(bytes)).length < this.#o.perSize) {
        const name = randomBytes(8).toString("hex");
        const tmp = path.join(dir, `.${name}.img`);
        try {
          await makeDiskImage(tmp, bytes, { nice: true });
          await rename(tmp, path.join(dir, `${name}.img`));
        } catch (err) {
          await rm(tmp, { force: true });
          if (!this.#sizes.has(bytes)) break; // dropped meanwhile
          throw err;
        }
      }
    }
  }
}
