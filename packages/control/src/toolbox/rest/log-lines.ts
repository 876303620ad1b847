// The reference's session log form: every output line prefixed by its stream's
// marker and ended by "\n". The agent keeps stdout and stderr apart as raw
// chunks; these helpers turn them into that form, with or without the markers.

export const STDOUT_MARK = Buffer.from([1, 1, 1]);
export const STDERR_MARK = Buffer.from([2, 2, 2]);
const NEWLINE = Buffer.from("\n");

/** A partial line longer than this is passed on without waiting for its end (memory stays bounded). */
const MAX_PARTIAL = 64 * 1024;

export type StreamName = "stdout" | "stderr";

/**
 * Streaming line formatter. A line is emitted when complete (or at `end`), so lines of the two
 * streams never mix; with `marks` each starts with its stream's marker. An endless line is passed
 * on in pieces of MAX_PARTIAL, each marked (the SDK demuxers assign bytes to the latest marker).
 */
export class LogLines {
  private readonly marks: boolean;
  private readonly partial: Record<StreamName, Buffer[]> = { stdout: [], stderr: [] };
  private readonly partialSize: Record<StreamName, number> = { stdout: 0, stderr: 0 };

  constructor(marks: boolean) {
    this.marks = marks;
  }

  push(stream: StreamName, data: Uint8Array): Buffer {
    const buf = Buffer.from(data.buffer, data.byteOffset, data.length);
    const out: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(0x0a, start);
      if (nl < 0) break;
      this.line(out, stream, buf.subarray(start, nl + 1));
      start = nl + 1;
    }
    if (start < buf.length) {
      // Copied: the caller's buffer may be reused.
      this.partial[stream].push(Buffer.from(buf.subarray(start)));
      this.partialSize[stream] += buf.length - start;
      if (this.partialSize[stream] >= MAX_PARTIAL) this.line(out, stream, Buffer.alloc(0));
    }
    return Buffer.concat(out);
  }

  /** The unfinished lines, each ended by "\n" as the reference does. */
  end(): Buffer {
    const out: Buffer[] = [];
    for (const stream of ["stdout", "stderr"] as const) {
      if (this.partialSize[stream] > 0) this.line(out, stream, NEWLINE);
    }
    return Buffer.concat(out);
  }

  private line(out: Buffer[], stream: StreamName, rest: Buffer) {
    if (this.marks) out.push(stream === "stdout" ? STDOUT_MARK : STDERR_MARK);
    out.push(...this.partial[stream], rest);
    this.partial[stream] = [];
    this.partialSize[stream] = 0;
  }
}

/** A marked log as plain combined text. */
export function stripMarks(marked: string): string {
  return marked.replace(/\x01\x01\x01|\x02\x02\x02/g, "");
}
