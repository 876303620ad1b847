import { ENV_LIMITS, errors } from "@sandbar/protocol";
import type { CreateSandboxRequest } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { Checks } from "../services/validate.ts";
import type { NewSandbox } from "./create.ts";
import { createNetwork, type DefaultNetwork, refuseDomainAllowList } from "./network-policy.ts";
import { gpuTypes, requestedClass } from "./sandbox-class.ts";
import { normalizeAutoArchive } from "./states.ts";

// POST /sandbox checked as the reference checks it: field problems together in one 400, then
// the rules one at a time, in the reference's order and words. Sandboxes come from the default
// snapshot or from an image snapshot (resolved by the service); a request that names its snapshot
// gives no resources (the reference's 400), one that names none may size the default snapshot.

/** The one snapshot sandboxes are made from, as GET /config names it. */
export const DEFAULT_SNAPSHOT = "sandbar-default";
export const DEFAULT_USER = "sandbar";
/** Defaults; the maxima are the organization's quota (organizations/usage.ts). */
export const RESOURCES = {
  cpu: { default: 1 },
  memory: { default: 1 },
  disk: { default: 3 },
} as const;

/**
 * Labels are returned with every sandbox in every list, and env goes into every process: both
 * are bounded (the reference sets no bound; a 1 MB label made every list 2 MB). ENV_LIMITS are
 * the agent's too (execute, code-run, terminals), from @sandbar/protocol.
 */
export const LABEL_LIMITS = { count: 64, key: 255, value: 1024, total: 16 * 1024 };

/** Count, key, value and total size limits of a string map, as field problems. */
export function mapLimits(checks: Checks, field: string, map: Record<string, string>, limits: typeof LABEL_LIMITS): Checks {
  const entries = Object.entries(map);
  checks.that(entries.length <= limits.count, `${field} must contain no more than ${limits.count} elements`);
  let total = 0;
  for (const [k, v] of entries) {
    total += k.length + v.length;
    checks.that(k.length > 0 && k.length <= limits.key, `each key in ${field} must be between 1 and ${limits.key} characters long`);
    checks.that(v.length <= limits.value, `${field}.${k.slice(0, 64)} must be shorter than or equal to ${limits.value} characters`);
  }
  return checks.that(total <= limits.total, `${field} must be smaller than ${limits.total} characters in all (keys and values)`);
}

const USER = /^[a-z_][a-z0-9_-]{0,31}$/;
export const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Checks a create request as the reference does (field problems together, then one by one). */
export function newSandbox(organizationId: string, req: CreateSandboxRequest, imageSnapshots = false, defaultNetwork: DefaultNetwork = "none"): Omit<NewSandbox, "regionId" | "volumes"> {
  const snapshot = (req.snapshot ?? req.image ?? "").trim();
  const checks = new Checks();
  if (req.name !== undefined) checks.displayName("name", req.name);
  const user = req.user ?? DEFAULT_USER;
  checks.that(USER.test(user), "user must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter or '_'");
  for (const key of Object.keys(req.env)) checks.that(ENV_KEY.test(key), `env name ${JSON.stringify(key.slice(0, 64))} is invalid: use letters, digits and '_', not starting with a digit`);
  mapLimits(checks, "labels", req.labels, LABEL_LIMITS);
  mapLimits(checks, "env", req.env, ENV_LIMITS);
  for (const field of ["cpu", "gpu", "memory", "disk"] as const) {
    const v = req[field];
    checks.that(v === undefined || v >= 0, `${field} must not be less than 0`);
  }
  checks.that(req.gpu === undefined || req.gpu <= 1, "gpu must not be greater than 1");
  const sandboxClass = requestedClass(req.workspaceClass);
  checks.that(sandboxClass !== undefined, `class must be one of the following values: ${["container", "linux-vm", "android", "windows"].join(", ")}`);
  checks.done();

  if (req.buildInfo && snapshot) throw errors.invalidArgument("Cannot specify a snapshot when using a build info entry");
  if (req.buildInfo && req.linkedSandbox) throw errors.invalidArgument("linkedSandbox is not supported with declarative builds. Create a sandbox from a snapshot");
  // As the reference: a named snapshot brings its own resources. A create naming no snapshot may
  // still size the default one (this server's extension: it has no other way to ask for them).
  if (!req.buildInfo && snapshot && (req.cpu || req.gpu || req.memory || req.disk)) throw errors.invalidArgument("Cannot specify Sandbox resources when using a snapshot");
  // Like the resources, a GPU type may be asked for only by a create that names no snapshot.
  if (!req.buildInfo && snapshot && req.gpuType.length > 0) {
    throw errors.invalidArgument("Cannot specify GPU type when creating sandbox from snapshot. GPU type is inherited from snapshot.");
  }
  if (req.gpuType.length > 0 && !req.gpu) throw errors.invalidArgument("gpuType is only allowed with gpu: 1 (it chooses the model of the sandbox's GPU)");
  if (snapshot && snapshot !== DEFAULT_SNAPSHOT && !imageSnapshots) throw errors.invalidArgument(`Snapshot ${snapshot} not found. Only the default snapshot (${DEFAULT_SNAPSHOT}) exists on this server`);
  if (req.gpu && (req.autoDeleteInterval ?? -1) !== 0) throw errors.invalidArgument("GPU sandboxes must be ephemeral - set autoDeleteInterval to 0");
  if (sandboxClass === "android" && !req.linkedSandbox) throw errors.invalidArgument("Android sandboxes must be linked to another sandbox");
  if (req.linkedSandbox) throw errors.unimplemented("Linked sandboxes are not supported yet");
  const network = createNetwork(req.networkBlockAll, req.networkAllowList, defaultNetwork);
  refuseDomainAllowList(req.domainAllowList);
  if (req.secrets.length > 0) throw errors.invalidArgument("secrets are not supported by this server yet (it keeps no secrets to mount): pass the values in env");

  const cpu = req.cpu || RESOURCES.cpu.default;
  const memory = req.memory || RESOURCES.memory.default;
  const disk = req.disk || RESOURCES.disk.default;

  const autoPause = req.autoPauseInterval ?? 0;
  if (autoPause < 0) throw errors.invalidArgument("Auto-pause interval must be non-negative");
  // Auto-pause replaces the default auto-stop; both set is the reference's 400.
  const autoStop = req.autoStopInterval ?? (autoPause > 0 ? 0 : 15);
  if (autoStop < 0) throw errors.invalidArgument("Auto-stop interval must be non-negative");
  if (autoStop > 0 && autoPause > 0) throw errors.invalidArgument(EXCLUSIVE_INTERVALS);
  if (autoPause > 0 && req.autoDeleteInterval === 0) throw errors.invalidArgument("Ephemeral sandboxes cannot have auto-pause enabled. Set autoPauseInterval to 0");
  const autoArchive = req.autoArchiveInterval ?? 10080;
  if (autoArchive < 0) throw errors.invalidArgument("Auto-archive interval must be non-negative");

  return {
    organizationId,
    name: req.name,
    // Another snapshot's name or id is resolved by the service (snapshots/service.ts).
    snapshot: snapshot || DEFAULT_SNAPSHOT,
    user,
    env: req.env,
    labels: req.labels,
    public: req.public ?? false,
    cpu,
    memory,
    disk,
    gpu: req.gpu ?? 0,
    // The preference order, each model once.
    gpuTypes: [...new Set(req.gpuType.map((t) => gpuTypes.name(t)).filter((t): t is string => t !== undefined))],
    sandboxClass: sandboxClass!,
    autoStopInterval: autoStop,
    autoPauseInterval: autoPause,
    autoArchiveInterval: normalizeAutoArchive(autoArchive),
    autoDeleteInterval: req.autoDeleteInterval ?? -1,
    networkBlockAll: network.networkBlockAll,
    networkAllowList: network.networkAllowList ?? null,
  };
}

/** The reference's 400 when a sandbox would have both an auto-stop and an auto-pause interval. */
export const EXCLUSIVE_INTERVALS = "autoStopInterval and autoPauseInterval are mutually exclusive. Set at most one of them to a non-zero value";
