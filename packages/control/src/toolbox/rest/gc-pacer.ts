import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

/**
 * File transfers allocate a buffer per chunk and almost no JS heap, so V8's young generation
 * rarely fills and dead chunk buffers pile up as external memory until a full collection notices
 * them (tens of MB per transfer). A cheap young-generation collection every few MB moved keeps
 * the control process's resident memory flat. (The agent does the same for its side.) It saves
 * CPU too: without it a REST upload cost control 3.9-5.5 s of CPU per GiB instead of 1.7-2.1
 * (round 7, `bench/toolbox/cpu.ts --upload 256`); every 16 MB instead of 4 was no better.
 */
const EVERY_BYTES = 4 * 1024 * 1024;

type GcFn = (options?: { type?: "minor" | "major"; execution?: "sync" | "async" }) => void;

let gc: GcFn | null | undefined;
let moved = 0;

function loadGc(): GcFn | null {
  try {
    setFlagsFromString("--expose-gc");
    return runInNewContext("gc") as GcFn;
  } catch {
    return null;
  }
}

/** Counts bytes a transfer moved; collects the young generation every EVERY_BYTES. */
export function noteMoved(bytes: number): void {
  moved += bytes;
  if (moved < EVERY_BYTES) return;
  moved = 0;
  if (gc === undefined) gc = loadGc();
  gc?.({ type: "minor" });
}
