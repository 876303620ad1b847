import { EventEmitter } from "node:events";
import { open } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { noteMoved } from "../util/gc-pacer.ts";

export const STDOUT = 1;
export const STDERR = 2;
export type StreamId = typeof STDOUT | typeof STDERR;

/** Bytes of a record header: stream id (1), length (4, big endian). */
const HEADER = 5;
/** Queued bytes past which the producer should pause. */
const HIGH_WATER = 4 * 1024 * 1024;

/**
 * One command's output on disk: a sequence of records (stream id, length,
 * bytes), so stdout and stderr stay apart, their order is kept and any byte
 * (NUL, partial lines) survives. Appends are queued and written in order;
 * readers see what has been written (`committed`) and can follow until `end`.
 */
export class CommandLog extends EventEmitter {
  readonly file: string;
  /** Bytes written to the file so far. */
  committed = 0;
  ended = false;
  private fh: FileHandle | undefined;
  private opening: Promise<FileHandle> | undefined;
  private queue: Buffer[] = [];
  private queued = 0;
  private writing = false;
  private endRequested = false;
  private failed: unknown;

  constructor(file: string) {
    super();
    this.file = file;
    this.setMaxListeners(0);
  }

  /** True when the producer should pause until "drain". */
  get full(): boolean {
    return this.queued >= HIGH_WATER;
  }

  append(stream: StreamId, data: Uint8Array): void {
    if (this.endRequested || data.length === 0) return;
    const header = Buffer.allocUnsafe(HEADER);
    header[0] = stream;
    header.writeUInt32BE(data.length, 1);
    this.queue.push(header, Buffer.from(data.buffer, data.byteOffset, data.length));
    this.queued += HEADER + data.length;
    void this.flush();
  }

  /** Marks the end of output once everything queued is written. */
  end(): Promise<void> {
    this.endRequested = true;
    void this.flush();
    if (this.ended) return Promise.resolve();
    return new Promise((resolve) => this.once("end", resolve));
  }

  private async flush(): Promise<void> {
    if (this.writing) return;
    this.writing = true;
    try {
      while (this.queue.length > 0) {
        const batch = this.queue;
        this.queue = [];
        const size = batch.reduce((n, b) => n + b.length, 0);
        if (this.failed === undefined) {
          try {
            this.fh ??= await (this.opening ??= open(this.file, "a", 0o600));
            let rest = batch;
            while (rest.length > 0) {
              const { bytesWritten } = await this.fh.writev(rest);
              rest = advance(rest, bytesWritten);
            }
            this.committed += size;
          } catch (err) {
            // A full disk must not take the agent down: the rest of the output is dropped.
            this.failed = err;
          }
        }
        this.queued -= size;
        this.emit("grow");
        if (this.queued < HIGH_WATER) this.emit("drain");
      }
      if (this.endRequested && !this.ended) {
        await this.fh?.close().catch(() => undefined);
        this.fh = undefined;
        this.ended = true;
        this.emit("end");
      }
    } finally {
      this.writing = false;
    }
  }
}

function advance(bufs: Buffer[], n: number): Buffer[] {
  let i = 0;
  while (i < bufs.length && n >= bufs[i].length) n -= bufs[i++].length;
  const rest = bufs.slice(i);
  if (n > 0 && rest.length > 0) rest[0] = rest[0].subarray(n);
  return rest;
}

export interface LogRecord {
  stream: StreamId;
  data: Buffer;
}

const READ_SIZE = 256 * 1024;

/**
 * The records of a log from its start. With follow, waits for more until the
 * log ends; otherwise stops at what is written now. Stops when signal aborts.
 */
export async function* readLog(log: CommandLog, follow: boolean, signal?: AbortSignal): AsyncGenerator<LogRecord> {
  let fh: FileHandle | undefined;
  let offset = 0;
  let carry = Buffer.alloc(0);
  const limit = () => (follow ? log.committed : snapshot);
  const snapshot = log.committed;
  try {
    for (;;) {
      if (signal?.aborted) return;
      const end = limit();
      if (offset < end) {
        fh ??= await open(log.file, "r");
        const want = Math.min(READ_SIZE, end - offset);
        const buf = Buffer.allocUnsafe(want);
        const { bytesRead } = await fh.read(buf, 0, want, offset);
        if (bytesRead === 0) return; // Truncated underneath us (session deleted).
        offset += bytesRead;
        noteMoved(bytesRead);
        let data = carry.length ? Buffer.concat([carry, buf.subarray(0, bytesRead)]) : buf.subarray(0, bytesRead);
        while (data.length >= HEADER) {
          const len = data.readUInt32BE(1);
          if (data.length < HEADER + len) break;
          yield { stream: data[0] as StreamId, data: data.subarray(HEADER, HEADER + len) };
          data = data.subarray(HEADER + len);
        }
        carry = Buffer.from(data);
        continue;
      }
      if (!follow || (log.ended && offset >= log.committed)) return;
      await new Promise<void>((resolve) => {
        const done = () => {
          log.off("grow", done);
          log.off("end", done);
          signal?.removeEventListener("abort", done);
          resolve();
        };
        log.on("grow", done);
        log.on("end", done);
        signal?.addEventListener("abort", done);
      });
    }
  } finally {
    await fh?.close().catch(() => undefined);
  }
}
