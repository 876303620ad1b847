import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { enumValueJson } from "@sandbar/protocol";
import { GpuTypeSchema } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";

// The GPUs a runner offers: SANDBAR_RUNNER_GPU / SANDBAR_RUNNER_GPU_TYPE when set, else the NVIDIA
// devices of the host (/dev/nvidia0, /dev/nvidia1, ...) and the model the driver names in
// /proc/driver/nvidia/gpus/*/information, spelled as a GpuType (H100, RTX-PRO-6000, ...).

/** The GpuType spellings of the contract (H100, RTX-PRO-6000, ...). */
const GPU_TYPES = GpuTypeSchema.values.filter((v) => v.number !== 0).map((v) => enumValueJson(v));

export interface Gpus {
  count: number;
  /** A GpuType spelling; "" when none or not one of them. */
  type: string;
}

export function detectGpus(devDir = "/dev", driverDir = "/proc/driver/nvidia/gpus"): Gpus {
  const count = list(devDir).filter((n) => /^nvidia\d+$/.test(n)).length;
  if (!count) return { count: 0, type: "" };
  for (const bus of list(driverDir)) {
    const info = read(path.join(driverDir, bus, "information"));
    const model = /^Model:\s*(.+)$/m.exec(info)?.[1];
    if (model) return { count, type: gpuTypeOf(model) };
  }
  return { count, type: "" };
}

/** The GpuType a driver's model name is, e.g. "NVIDIA H100 80GB HBM3" -> H100; "" when none. */
export function gpuTypeOf(model: string): string {
  const words = model.toUpperCase().replace(/[\s_]+/g, "-");
  // Longest first: RTX-PRO-6000 before a shorter name it contains.
  const known = [...GPU_TYPES].sort((a, b) => b.length - a.length);
  return known.find((t) => new RegExp(`(^|-)${t}(-|$)`).test(words)) ?? "";
}

/** The settings' GPUs, else the host's. */
export function loadGpus(env: NodeJS.ProcessEnv, detect: () => Gpus = detectGpus): Gpus {
  const raw = env.SANDBAR_RUNNER_GPU;
  const type = env.SANDBAR_RUNNER_GPU_TYPE ?? "";
  if (type !== "" && !GPU_TYPES.includes(type)) throw new Error(`SANDBAR_RUNNER_GPU_TYPE must be one of ${GPU_TYPES.join(", ")}, got "${type}"`);
  if (raw === undefined || raw === "") {
    const found = detect();
    return { count: found.count, type: type || found.type };
  }
  const count = Number(raw);
  if (!Number.isInteger(count) || count < 0 || count > 64) throw new Error(`SANDBAR_RUNNER_GPU must be a whole number from 0 to 64, got "${raw}"`);
  return { count, type: count ? type : "" };
}

function list(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

function read(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return "";
  }
}
