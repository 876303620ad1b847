import type { ResizeSandboxRequest } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { Checks } from "../services/validate.ts";
import type { Resources } from "./reconfigure.ts";

// POST /sandbox/{id}/resize checked as the reference's ResizeSandbox DTO: each of cpu, memory
// and disk optional, a number, at least 1 (the field problems together in one 400). The rules
// that need the sandbox (state, direction, quota) are the manager's.

export function resizeRequest(req: ResizeSandboxRequest): Partial<Resources> {
  const checks = new Checks();
  const out: Partial<Resources> = {};
  for (const field of ["cpu", "memory", "disk"] as const) {
    const v = req[field];
    if (v === undefined) continue;
    checks.that(v >= 1, `${field} must not be less than 1`);
    out[field] = v;
  }
  checks.done();
  return out;
}
