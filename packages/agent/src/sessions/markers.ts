import { STDERR, STDOUT } from "./command-log.ts";
import type { StreamId } from "./command-log.ts";

/** The reference's per-line stream markers in a command log. */
export const STDOUT_MARK = Buffer.from([1, 1, 1]);
export const STDERR_MARK = Buffer.from([2, 2, 2]);

/**
 * Turns stdout/stderr chunks into the reference's log form: every line
 * prefixed by its stream's marker and ended by "\n"; a line is emitted when
 * complete (or at the end), so lines of the two streams never mix. Streaming:
 * feed chunks with push, then call end once.
 */
export class LineMarker {
  private partial: Record<StreamId, Buffer[]> = { [STDOUT]: [], [STDERR]: [] };

  push(stream: StreamId, data: Uint8Array): Buffer {
    const mark = stream === STDOUT ? STDOUT_MARK : STDERR_MARK;
    const out: Buffer[] = [];
    const buf = Buffer.from(data.buffer, data.byteOffset, data.length);
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(0x0a, start);
      if (nl < 0) break;
      out.push(mark, ...this.partial[stream], buf.subarray(start, nl + 1));
      this.partial[stream] = [];
      start = nl + 1;
    }
    if (start < buf.length) this.partial[stream].push(Buffer.from(buf.subarray(start)));
    return Buffer.concat(out);
  }

  end(): Buffer {
    const out: Buffer[] = [];
    for (const stream of [STDOUT, STDERR] as const) {
      if (this.partial[stream].length === 0) continue;
      out.push(stream === STDOUT ? STDOUT_MARK : STDERR_MARK, ...this.partial[stream], Buffer.from("\n"));
      this.partial[stream] = [];
    }
    return Buffer.concat(out);
  }
}

/** Most bytes of each stream a unary answer carries. */
export const UNARY_LIMIT = 16 * 1024 * 1024;

/** Collects a command's output as the reference answers it: marked output, stdout, stderr. */
export class OutputCollector {
  private marker = new LineMarker();
  private output: Buffer[] = [];
  private streams: Record<StreamId, Buffer[]> = { [STDOUT]: [], [STDERR]: [] };
  private sizes: Record<StreamId, number> = { [STDOUT]: 0, [STDERR]: 0 };
  truncated = false;

  push(stream: StreamId, data: Buffer): void {
    let chunk = data;
    const room = UNARY_LIMIT - this.sizes[stream];
    if (room <= 0) {
      this.truncated = true;
      return;
    }
    if (chunk.length > room) {
      chunk = chunk.subarray(0, room);
      this.truncated = true;
    }
    this.sizes[stream] += chunk.length;
    this.streams[stream].push(chunk);
    this.output.push(this.marker.push(stream, chunk));
  }

  result(): { output: string; stdout: string; stderr: string; truncated: boolean } {
    this.output.push(this.marker.end());
    const text = (stream: StreamId) => {
      const s = Buffer.concat(this.streams[stream]).toString("utf8");
      return s === "" || s.endsWith("\n") ? s : s + "\n";
    };
    return {
      output: Buffer.concat(this.output).toString("utf8"),
      stdout: text(STDOUT),
      stderr: text(STDERR),
      truncated: this.truncated,
    };
  }
}

/** Removes the markers from a marked log (for clients that want plain combined text). */
export function stripMarkers(marked: Buffer): Buffer {
  const out: Buffer[] = [];
  let start = 0;
  for (let i = 0; i + 2 < marked.length; i++) {
    const b = marked[i];
    if ((b === 1 || b === 2) && marked[i + 1] === b && marked[i + 2] === b) {
      out.push(marked.subarray(start, i));
      start = i + 3;
      i += 2;
    }
  }
  out.push(marked.subarray(start));
  return Buffer.concat(out);
}
