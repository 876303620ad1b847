import { errors } from "@sandbar/protocol";
import { GpuTypeSchema, SandboxClassSchema } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { enumCodec } from "./dto.ts";

// Sandbox classes and GPU types as the reference spells them. A sandbox of a class goes only to a
// runner of that class (android ones to container runners, as the reference places them); the
// in-process runtime of `sandbar serve` is a container runner without GPUs.

export const sandboxClasses = enumCodec(SandboxClassSchema);
export const gpuTypes = enumCodec(GpuTypeSchema);

export const DEFAULT_CLASS = "container";
/** The earlier `class` of /workspace: a size, accepted and ignored. */
const LEGACY_SIZES = new Set(["small", "medium", "large"]);

/** The class a create asks for (`class`), or undefined when it names none of them. */
export function requestedClass(raw: string | undefined): string | undefined {
  const v = (raw ?? "").trim();
  if (v === "" || LEGACY_SIZES.has(v)) return DEFAULT_CLASS;
  return sandboxClasses.names.includes(v) ? v : undefined;
}

/** The runner class that takes sandboxes of `sandboxClass`. */
export function runnerClassFor(sandboxClass: string): string {
  return sandboxClass === "android" ? DEFAULT_CLASS : sandboxClass;
}

/** The reference's refusal when no runner of the region can take a sandbox. */
export function noAvailableRunners(gpuTypes: readonly string[] = []): Error {
  return errors.invalidArgument(gpuTypes.length ? `No available runners with GPU type: ${gpuTypes.join(", ")}` : "No available runners");
}

/** Whether this server's own runtime (class container, no GPU) can take the sandbox. */
export function fitsInProcess(need: { gpu: number; sandboxClass: string }): boolean {
  return need.gpu === 0 && runnerClassFor(need.sandboxClass) === DEFAULT_CLASS;
}
