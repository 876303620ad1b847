import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

type GcFn = (options?: { type?: "minor" | "major"; execution?: "sync" | "async" }) => void;

let gc: GcFn | null | undefined;

/** V8's gc(), exposed at run time (the agent is not started with --expose-gc). */
function getGc(): GcFn | null {
  if (gc !== undefined) return gc;
  try {
    setFlagsFromString("--expose-gc");
    gc = runInNewContext("gc") as GcFn;
  } catch {
    gc = null;
  }
  return gc;
}

/**
 * Streams allocate a large buffer per chunk but almost no JS heap, so V8's
 * young generation rarely fills and dead chunk buffers pile up as external
 * memory until an expensive full collection notices them (tens of MB per
 * stream). Running a cheap young-generation collection every few MB moved
 * keeps a transfer's resident memory flat.
 */
const EVERY_BYTES = 4 * 1024 * 1024;
let moved = 0;

/** Counts bytes a stream moved; collects the young generation every EVERY_BYTES. */
export function noteMoved(bytes: number): void {
  moved += bytes;
  if (moved < EVERY_BYTES) return;
  moved = 0;
  getGc()?.({ type: "minor" });
}
