import { randomBytes } from "node:crypto";
import { lstat, mkdir, open, realpath, rename, stat, unlink } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { readFileSync, type Stats } from "node:fs";
import * as path from "node:path";
import { errors } from "@sandbar/protocol";
import { fsError } from "../util/fs-errors.ts";
import { noteMoved } from "../util/gc-pacer.ts";
import { uploadEnded, uploadStarted } from "./upload-journal.ts";

/**
 * Size of the data chunks a download yields: just under 512 KiB, so that a
 * chunk with its field header fits the power-of-two buffer protobuf-es's
 * writer grows to (512 KiB exactly would make it allocate 1 MiB per chunk).
 */
export const CHUNK_SIZE = 512 * 1024 - 64;

/** Opens a regular file for reading; directories and non-files are INVALID_ARGUMENT. */
export async function openForDownload(p: string): Promise<{ fh: FileHandle; size: bigint }> {
  let fh: FileHandle;
  try {
    fh = await open(p, "r");
  } catch (err) {
    throw fsError(err, p);
  }
  try {
    const st = await fh.stat({ bigint: true });
    if (st.isDirectory()) throw errors.invalidArgument(`path points to a directory: ${p}`);
    return { fh, size: st.size };
  } catch (err) {
    await fh.close();
    throw fsError(err, p);
  }
}

/**
 * The file's bytes in chunks. Pulling is the backpressure. The chunks share
 * one buffer: a yielded chunk is valid until the next is pulled, which is
 * how Connect consumes a response stream (each message is serialized before
 * the next is asked for); it spares an allocation per chunk.
 */
export async function* readChunks(fh: FileHandle, signal?: AbortSignal): AsyncGenerator<Uint8Array> {
  const buf = Buffer.allocUnsafe(CHUNK_SIZE);
  for (;;) {
    if (signal?.aborted) return;
    const { bytesRead } = await fh.read(buf, 0, CHUNK_SIZE, null);
    if (bytesRead === 0) return;
    noteMoved(bytesRead);
    yield buf.subarray(0, bytesRead);
  }
}

/** Bytes of an upload that may be on their way to disk while the next chunks arrive. */
const WRITE_AHEAD = 4 * 1024 * 1024;

/** Bytes queued before a write starts (the rest at close): fewer, larger writes. */
const WRITE_BATCH = 1024 * 1024;

/** Most chunks in one writev(2) (Linux's IOV_MAX is 1024). */
const MAX_IOV = 256;

/** A temporary file an upload writes before it takes the target's place. */
interface Replacement {
  temp: string;
  /** The file it replaces (a symbolic link's target: the link stays). */
  target: string;
}

let umaskBits: number | undefined;

/** This process's umask (read once from /proc: process.umask() without arguments is deprecated). */
function umask(): number {
  if (umaskBits === undefined) {
    try {
      umaskBits = parseInt(/^Umask:\s+([0-7]+)/m.exec(readFileSync("/proc/self/status", "latin1"))?.[1] ?? "022", 8);
    } catch {
      umaskBits = 0o777; // unknown: always chmod
    }
  }
  return umaskBits;
}

/** Bytes of a file name (NAME_MAX) and of what a temporary name adds to the target's. */
const NAME_MAX = 255;
const TEMP_SUFFIX = ".sandbar-upload-".length + 16;

/** `.<name>.sandbar-upload-<16 random hex>` beside target, the name cut to fit NAME_MAX. */
function tempBeside(target: string): string {
  let name = path.basename(target);
  while (Buffer.byteLength(name) > NAME_MAX - 1 - TEMP_SUFFIX) name = name.slice(0, -1);
  return path.join(path.dirname(target), `.${name}.sandbar-upload-${randomBytes(8).toString("hex")}`);
}

/**
 * What an upload to p replaces: undefined when it must write p in place, as before uploads were
 * atomic. In place: what a rename would change (a file with other hard links, a device or FIFO, a
 * symbolic link to nothing), or a directory (its open fails as it did). `existing` is the stat of
 * the file replaced, whose mode and owner the new one takes.
 */
async function replacementOf(p: string): Promise<{ target: string; existing?: Stats } | undefined> {
  let st: Stats;
  try {
    st = await lstat(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return { target: p };
    throw err;
  }
  let target = p;
  if (st.isSymbolicLink()) {
    try {
      target = await realpath(p);
      st = await stat(target);
    } catch {
      return undefined;
    }
  }
  return st.isFile() && st.nlink === 1 ? { target, existing: st } : undefined;
}

/**
 * A file being written by an upload: parents created. The content goes to a temporary file
 * beside the target (the target's mode and owner given to it), renamed over the target on
 * close and removed on failure, so the target is never seen half-written: an interrupted upload
 * leaves the old file or none. Where a rename would change more than the content (see
 * replacementOf), or the directory takes no new file, the target is truncated and written in
 * place as before.
 * Chunks queue while a write is in flight and go to disk together in one
 * writev(2) when it returns, up to WRITE_AHEAD bytes queued or in flight, so
 * disk writes overlap with receiving and a fast sender costs one system call
 * (and one thread-pool round trip) per several chunks instead of one each.
 */
export class UploadTarget {
  /** The path asked for (errors name it). */
  readonly path: string;
  /** The destination as the caller gave it. */
  readonly shownPath: string;
  bytes = 0n;
  private readonly replacement: Replacement | undefined;
  private fh: FileHandle | undefined;
  /** File offset of the first queued byte. */
  private offset = 0;
  private queue: Uint8Array[] = [];
  private queuedBytes = 0;
  /** The write in flight (it writes whatever is queued when it starts, and then what queued meanwhile). */
  private flushing: Promise<void> | undefined;
  /** Writers waiting for room in the queue: woken after each write. */
  private waiting: (() => void)[] = [];
  private failed: unknown;

  private constructor(p: string, shownPath: string, fh: FileHandle, replacement?: Replacement) {
    this.path = p;
    this.shownPath = shownPath;
    this.fh = fh;
    this.replacement = replacement;
  }

  static async create(p: string, shownPath: string): Promise<UploadTarget> {
    try {
      // The parent made and the target looked at side by side (one thread-pool round trip less);
      // the parent's failure is the one to report (a file where a directory should be: EEXIST).
      const [made, looked] = await Promise.allSettled([mkdir(path.dirname(p), { recursive: true, mode: 0o755 }), replacementOf(p)]);
      if (made.status === "rejected") throw made.reason;
      if (looked.status === "rejected") throw looked.reason;
      const plan = looked.value;
      const replacement = plan && (await UploadTarget.openTemp(plan.target, plan.existing));
      if (replacement) return new UploadTarget(p, shownPath, replacement.fh, replacement);
      return new UploadTarget(p, shownPath, await open(p, "w", 0o644));
    } catch (err) {
      throw fsError(err, p);
    }
  }

  /**
   * The temporary file for target, with the existing file's mode and owner; undefined (in place
   * then) when the directory takes no new file or the owner cannot be given (a file of another
   * user that this one may write: only root could).
   */
  private static async openTemp(target: string, existing: Stats | undefined): Promise<(Replacement & { fh: FileHandle }) | undefined> {
    const temp = tempBeside(target);
    // A new target's mode as before (0644 through the umask); an existing one's, exactly.
    const mode = existing ? existing.mode & 0o7777 : 0o644;
    // Its directory recorded before it is made (only the first upload into a directory in this
    // agent's life waits for a write), so a crash leaves no file the next agent does not look for.
    await uploadStarted(temp);
    const opened = await open(temp, "wx", mode & 0o777).then(
      (fh) => ({ fh }),
      (err: unknown) => ({ err }),
    );
    if ("err" in opened) {
      uploadEnded(temp);
      const code = (opened.err as NodeJS.ErrnoException).code;
      if (code === "EACCES" || code === "EPERM" || code === "ENAMETOOLONG") return undefined;
      throw opened.err;
    }
    const { fh } = opened;
    if (existing) {
      try {
        // chown first: it clears set-user-id and set-group-id bits, which chmod then restores.
        const chowned = existing.uid !== process.geteuid?.() || existing.gid !== process.getegid?.();
        if (chowned) await fh.chown(existing.uid, existing.gid);
        if ((mode & 0o7000) !== 0 || (mode & umask()) !== 0) await fh.chmod(mode);
      } catch (err) {
        await fh.close().catch(() => undefined);
        await unlink(temp).catch(() => undefined);
        uploadEnded(temp);
        if ((err as NodeJS.ErrnoException).code === "EPERM") return undefined;
        throw err;
      }
    }
    return { temp, target, fh };
  }

  /**
   * Queues the pieces of one or more chunks, in order (the caller must not
   * reuse their buffers); waits while too much is queued.
   */
  async write(pieces: readonly Uint8Array[]): Promise<void> {
    if (!this.fh) throw errors.internal(`upload of ${this.path} is already closed`);
    if (this.failed !== undefined) throw fsError(this.failed, this.path);
    let n = 0;
    for (const p of pieces) {
      if (p.length === 0) continue;
      this.queue.push(p);
      n += p.length;
    }
    if (n === 0) return;
    this.queuedBytes += n;
    this.bytes += BigInt(n);
    noteMoved(n);
    if (this.queuedBytes >= WRITE_BATCH) this.flushing ??= this.flush();
    while (this.queuedBytes > WRITE_AHEAD && this.flushing) await new Promise<void>((r) => this.waiting.push(r));
    if (this.failed !== undefined) throw fsError(this.failed, this.path);
  }

  /** Writes the queue in order until it is empty; the first error stops it and is kept. */
  private async flush(): Promise<void> {
    const fh = this.fh!; // Taken before close() lets go of it.
    try {
      while (this.queue.length > 0 && this.failed === undefined) {
        let pending = this.queue.splice(0, MAX_IOV);
        while (pending.length > 0) {
          const { bytesWritten } = await fh.writev(pending, this.offset);
          if (bytesWritten === 0) throw new Error(`no progress writing ${this.path}`);
          this.offset += bytesWritten;
          this.queuedBytes -= bytesWritten;
          pending = rest(pending, bytesWritten);
          this.wake();
        }
      }
    } catch (err) {
      this.failed ??= err;
    } finally {
      this.flushing = undefined;
      this.wake();
    }
  }

  private wake(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const w of waiting) w();
  }

  /**
   * Waits for every write, then closes the file, surfacing close errors (they matter on network
   * file systems), and puts it in the target's place.
   */
  async close(): Promise<void> {
    const fh = this.fh;
    if (!fh) return;
    if (this.queue.length > 0) this.flushing ??= this.flush();
    this.fh = undefined;
    await this.flushing;
    const r = this.replacement;
    try {
      if (this.failed !== undefined) throw this.failed;
      await fh.close();
      if (r) await rename(r.temp, r.target);
    } catch (err) {
      await fh.close().catch(() => undefined);
      await this.removeTemp();
      throw fsError(err, this.path);
    }
    if (r) uploadEnded(r.temp);
    if (this.bytes >= WRITEBACK_MIN_BYTES) startWriteback(r?.target ?? this.path);
  }

  /** Closes without reporting: the upload failed anyway. Its temporary file goes; a target written in place stays as far as it got. */
  async abandon(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    this.failed ??= new Error("upload abandoned");
    await this.flushing;
    this.queue = [];
    await fh?.close().catch(() => undefined);
    if (fh) await this.removeTemp();
  }

  private async removeTemp(): Promise<void> {
    const r = this.replacement;
    if (!r) return;
    await unlink(r.temp).catch(() => undefined);
    uploadEnded(r.temp);
  }
}

/** Smallest finished upload whose writeback is started at once (smaller ones are not worth a sync). */
const WRITEBACK_MIN_BYTES = 8n * 1024n * 1024n;
/** Finished uploads whose writeback is to start, one at a time (a sync holds one of libuv's 4 threads). */
const toWriteBack: string[] = [];
let writingBack = false;

/**
 * Starts writing a finished upload's dirty pages to disk (fdatasync on a new
 * descriptor, in the background: nobody waits for it). A sandbox's memory
 * cgroup (v1) has no dirty limit of its own: left to the host's thresholds
 * (GBs), one upload's dirty pages stay in the cgroup and the next upload waits
 * in reclaim for them to be written; started now, they are written while the
 * next one arrives. (Started every 64 MiB during the upload instead, it kept
 * the dirty pages near 64 MiB but halved the upload's throughput.)
 */
function startWriteback(p: string): void {
  if (!toWriteBack.includes(p)) toWriteBack.push(p);
  if (writingBack) return;
  writingBack = true;
  void (async () => {
    for (let next = toWriteBack.shift(); next !== undefined; next = toWriteBack.shift()) {
      try {
        const fh = await open(next, "r");
        await fh.datasync().finally(() => fh.close());
      } catch {
        // Only a hint: the file may be gone already.
      }
    }
    writingBack = false;
  })();
}

/** What is left of `bufs` after its first `n` bytes were written (a short write). */
function rest(bufs: Uint8Array[], n: number): Uint8Array[] {
  let i = 0;
  while (i < bufs.length && n >= bufs[i].length) n -= bufs[i++].length;
  if (i === bufs.length) return [];
  return n === 0 ? bufs.slice(i) : [bufs[i].subarray(n), ...bufs.slice(i + 1)];
}
