// The reference's session log form: every output line prefixed by its stream's
// marker and ended by "\n". The agent answers typed stdout and stderr chunks; this
// is the one place they are turned into that form, with or without the markers.

import type { LogChunk } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";

const STDOUT_MARK = Buffer.from([1, 1, 1]);
const STDERR_MARK = Buffer.from([2, 2, 2]);
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

/** The reference's answer for a whole log: `output` (marked, or plain combined text), and each stream ending in "\n". */
export function referenceOutput(chunks: readonly LogChunk[], marks: boolean): { output: string; stdout: string; stderr: string } {
  const lines = new LogLines(marks);
  const out: Buffer[] = [];
  const streams: Record<StreamName, Buffer[]> = { stdout: [], stderr: [] };
  for (const { data } of chunks) {
    if (data.case !== "stdout" && data.case !== "stderr") continue;
    out.push(lines.push(data.case, data.value));
    streams[data.case].push(Buffer.from(data.value));
  }
  out.push(lines.end());
  const text = (s: StreamName) => {
    const t = Buffer.concat(streams[s]).toString("utf8");
    return t === "" || t.endsWith("\n") ? t : t + "\n";
  };
  return { output: Buffer.concat(out).toString("utf8"), stdout: text("stdout"), stderr: text("stderr") };
}
