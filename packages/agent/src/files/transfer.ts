import { open, mkdir } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import * as path from "node:path";
import { errors } from "@sandbar/protocol";
import { fsError } from "../util/fs-errors.ts";
import { noteMoved } from "../util/gc-pacer.ts";

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

/**
 * A file being written by an upload: parents created, truncated on open.
 * Chunks are written at their offsets without waiting for each other, up to
 * WRITE_AHEAD bytes in flight, so disk writes overlap with receiving.
 */
export class UploadTarget {
  readonly path: string;
  /** The destination as the caller gave it. */
  readonly shownPath: string;
  bytes = 0n;
  private fh: FileHandle | undefined;
  private offset = 0;
  private inFlight = new Set<Promise<void>>();
  private inFlightBytes = 0;
  private failed: unknown;

  private constructor(p: string, shownPath: string, fh: FileHandle) {
    this.path = p;
    this.shownPath = shownPath;
    this.fh = fh;
  }

  static async create(p: string, shownPath: string): Promise<UploadTarget> {
    try {
      await mkdir(path.dirname(p), { recursive: true, mode: 0o755 });
      return new UploadTarget(p, shownPath, await open(p, "w", 0o644));
    } catch (err) {
      throw fsError(err, p);
    }
  }

  /** Queues a chunk (the caller must not reuse its buffer); waits while too much is in flight. */
  async write(data: Uint8Array): Promise<void> {
    const fh = this.fh;
    if (!fh) throw errors.internal(`upload of ${this.path} is already closed`);
    if (this.failed !== undefined) throw fsError(this.failed, this.path);
    const at = this.offset;
    this.offset += data.length;
    this.bytes += BigInt(data.length);
    noteMoved(data.length);
    const done: Promise<void> = (async () => {
      let off = 0;
      while (off < data.length) off += (await fh.write(data, off, data.length - off, at + off)).bytesWritten;
    })().then(
      () => undefined,
      (err: unknown) => {
        this.failed ??= err;
      },
    );
    this.inFlight.add(done);
    this.inFlightBytes += data.length;
    void done.then(() => {
      this.inFlight.delete(done);
      this.inFlightBytes -= data.length;
    });
    while (this.inFlightBytes > WRITE_AHEAD) await Promise.race(this.inFlight);
    if (this.failed !== undefined) throw fsError(this.failed, this.path);
  }

  /** Waits for every write, then closes the file, surfacing close errors (they matter on network file systems). */
  async close(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    if (!fh) return;
    await Promise.all(this.inFlight);
    try {
      if (this.failed !== undefined) throw this.failed;
      await fh.close();
    } catch (err) {
      await fh.close().catch(() => undefined);
      throw fsError(err, this.path);
    }
  }

  /** Closes without reporting: the upload failed anyway. */
  async abandon(): Promise<void> {
    const fh = this.fh;
    this.fh = undefined;
    await Promise.all(this.inFlight);
    await fh?.close().catch(() => undefined);
  }
}
