import type { LogChunk } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { STDERR, STDOUT, type StreamId } from "./command-log.ts";

/** Most bytes of each stream a unary answer carries. */
const UNARY_LIMIT = 16 * 1024 * 1024;

type Chunk = Pick<LogChunk, "data">;

/**
 * A command's output for a unary answer: typed chunks in the order written, consecutive chunks
 * of one stream joined, each stream cut at UNARY_LIMIT. How a client wants it shown (the
 * reference's markers, split streams) is the control plane's business.
 */
export class ChunkCollector {
  private readonly chunks: Array<{ stream: StreamId; parts: Buffer[] }> = [];
  private readonly sizes: Record<StreamId, number> = { [STDOUT]: 0, [STDERR]: 0 };
  truncated = false;

  push(stream: StreamId, data: Buffer): void {
    const room = UNARY_LIMIT - this.sizes[stream];
    if (room <= 0 || data.length > room) this.truncated = true;
    if (room <= 0) return;
    const part = data.length > room ? data.subarray(0, room) : data;
    this.sizes[stream] += part.length;
    const last = this.chunks[this.chunks.length - 1];
    if (last?.stream === stream) last.parts.push(part);
    else this.chunks.push({ stream, parts: [part] });
  }

  result(): { chunks: Chunk[]; truncated: boolean } {
    const chunks = this.chunks.map(({ stream, parts }): Chunk => {
      const value = Buffer.concat(parts);
      return { data: stream === STDOUT ? { case: "stdout", value } : { case: "stderr", value } };
    });
    return { chunks, truncated: this.truncated };
  }
}
