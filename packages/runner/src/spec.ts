import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { BindMount, InitCommand, NetworkMode, SandboxResources, SandboxSpec, VolumeMount } from "./provider.ts";
import { SANDBOX_PATHS } from "./provider.ts";

// Shape checks every provider shares. They run before anything touches the host, and say
// exactly what is wrong, because specs come from API callers.

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const USER = /^[a-z_][a-z0-9_-]{0,31}$/;
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MiB = 2 ** 20;
const GiB = 2 ** 30;

const DEFAULT_USER = "sandbar";

/** Whether `id` is a sandbox id validateId accepts (names found on the host are filtered so). */
export function isSandboxId(id: string): boolean {
  return ID.test(id);
}

export function validateId(id: unknown): string {
  if (typeof id !== "string" || !ID.test(id)) {
    throw errors.invalidArgument(
      `sandbox id ${JSON.stringify(id)} is invalid: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit`,
    );
  }
  return id;
}

function finite(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v)) throw errors.invalidArgument(`${name} must be a number`);
  return v;
}

function absolutePath(name: string, p: unknown): string {
  if (typeof p !== "string" || !path.isAbsolute(p) || p.includes("\0")) {
    throw errors.invalidArgument(`${name} must be an absolute path, got ${JSON.stringify(p)}`);
  }
  if (p.split("/").includes("..")) throw errors.invalidArgument(`${name} must not contain '..': ${p}`);
  return path.normalize(p);
}

const reservedTargets = ["/proc", "/dev", SANDBOX_PATHS.runDir, "/opt/sandbar"];

function validateVolume(v: VolumeMount, i: number): VolumeMount {
  if (typeof v !== "object" || v === null) throw errors.invalidArgument(`volumes[${i}] must be an object`);
  const root = absolutePath(`volumes[${i}].root`, v.root);
  const { target } = validateMount({ source: root, target: v.target }, i);
  if (v.subpath === undefined || v.subpath === "") return { root, target };
  if (typeof v.subpath !== "string" || v.subpath.startsWith("/") || v.subpath.includes("\0") || v.subpath.split("/").includes("..")) {
    throw errors.invalidArgument(`volumes[${i}].subpath must be a relative path without '..'`);
  }
  return { root, target, subpath: path.normalize(v.subpath) };
}

function validateMount(m: BindMount, i: number): BindMount {
  if (typeof m !== "object" || m === null) throw errors.invalidArgument(`mounts[${i}] must be an object`);
  const source = absolutePath(`mounts[${i}].source`, m.source);
  const target = absolutePath(`mounts[${i}].target`, m.target);
  if (target === "/") throw errors.invalidArgument(`mounts[${i}].target must not be '/'`);
  for (const r of reservedTargets) {
    if (target === r || target.startsWith(r + "/") || r.startsWith(target + "/")) {
      throw errors.invalidArgument(`mounts[${i}].target ${target} is reserved by the runner (${r})`);
    }
  }
  if (m.readonly !== undefined && typeof m.readonly !== "boolean") {
    throw errors.invalidArgument(`mounts[${i}].readonly must be a boolean`);
  }
  return { source, target, readonly: m.readonly ?? true };
}

function stringArray(name: string, v: unknown): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || v.some((a) => typeof a !== "string" || a.includes("\0"))) {
    throw errors.invalidArgument(`${name} must be an array of strings without NUL characters`);
  }
  return v as string[];
}

function validateInit(init: InitCommand | undefined): InitCommand {
  if (typeof init !== "object" || init === null) throw errors.invalidArgument("init is required");
  const out: InitCommand = {
    node: absolutePath("init.node", init.node),
    bundle: absolutePath("init.bundle", init.bundle),
    nodeArgs: stringArray("init.nodeArgs", init.nodeArgs),
    args: stringArray("init.args", init.args),
  };
  if (init.main !== undefined) {
    if (typeof init.main !== "string" || init.main === "" || path.isAbsolute(init.main) || init.main.split("/").includes("..")) {
      throw errors.invalidArgument(`init.main must be a relative path inside the bundle, got ${JSON.stringify(init.main)}`);
    }
    out.main = path.normalize(init.main);
  }
  if (init.secret !== undefined) {
    if (typeof init.secret !== "string" || init.secret.includes("\0")) throw errors.invalidArgument("init.secret must be a string");
    out.secret = init.secret;
  }
  return out;
}

/** Returns a normalised copy of the spec, or throws invalidArgument naming the bad field. */
export function validateSpec(spec: SandboxSpec): SandboxSpec {
  if (typeof spec !== "object" || spec === null) throw errors.invalidArgument("sandbox spec is required");
  const id = validateId(spec.id);
  const rootfs = absolutePath("rootfs", spec.rootfs);

  const cpu = finite("cpu", spec.cpu);
  if (cpu < 0.01) throw errors.invalidArgument(`cpu must be at least 0.01 cores, got ${cpu}`);
  const memoryGiB = finite("memoryGiB", spec.memoryGiB);
  if (memoryGiB * GiB < 16 * MiB) throw errors.invalidArgument(`memoryGiB must be at least 16 MiB (0.015625), got ${memoryGiB}`);
  let diskGiB: number | undefined;
  if (spec.diskGiB !== undefined && spec.diskGiB !== null) {
    diskGiB = finite("diskGiB", spec.diskGiB);
    if (diskGiB * GiB < 16 * MiB) throw errors.invalidArgument(`diskGiB must be at least 16 MiB (0.015625), got ${diskGiB}`);
  }
  const pidsLimit = finite("pidsLimit", spec.pidsLimit);
  if (!Number.isInteger(pidsLimit) || pidsLimit < 1) throw errors.invalidArgument(`pidsLimit must be a positive integer, got ${pidsLimit}`);

  const env: Record<string, string> = {};
  if (spec.env !== undefined) {
    if (typeof spec.env !== "object" || spec.env === null) throw errors.invalidArgument("env must be an object of strings");
    for (const [k, v] of Object.entries(spec.env)) {
      if (!ENV_KEY.test(k)) throw errors.invalidArgument(`env name ${JSON.stringify(k)} is invalid`);
      if (typeof v !== "string" || v.includes("\0")) throw errors.invalidArgument(`env ${k} must be a string without NUL characters`);
      env[k] = v;
    }
  }

  const network = spec.network ?? "none";
  if (!NETWORK_MODES.includes(network)) {
    throw errors.invalidArgument(`network mode ${JSON.stringify(network)} is not supported: one of ${NETWORK_MODES.join(", ")}`);
  }
  const networkAllowList = validateAllowList(spec.networkAllowList);
  const user = spec.user ?? DEFAULT_USER;
  if (typeof user !== "string" || !USER.test(user)) {
    throw errors.invalidArgument(`user ${JSON.stringify(user)} is invalid: lower-case letters, digits, '_' or '-', at most 32`);
  }
  if (spec.mounts !== undefined && !Array.isArray(spec.mounts)) throw errors.invalidArgument("mounts must be an array");
  const mounts = (spec.mounts ?? []).map(validateMount);
  if (spec.volumes !== undefined && !Array.isArray(spec.volumes)) throw errors.invalidArgument("volumes must be an array");
  const volumes = (spec.volumes ?? []).map(validateVolume);

  const out: SandboxSpec = { id, rootfs, mounts, cpu, memoryGiB, pidsLimit, env, network, user, init: validateInit(spec.init) };
  if (volumes.length > 0) out.volumes = volumes;
  const layers = validateLayers(spec.layers);
  if (layers.length > 0) out.layers = layers;
  if (network === "allow-list") out.networkAllowList = networkAllowList;
  if (diskGiB !== undefined) out.diskGiB = diskGiB;
  if (spec.workdir !== undefined) {
    const w = spec.workdir;
    if (typeof w !== "string" || !w.startsWith("/") || w.includes("\0") || w.length > 4096 || w.split("/").includes("..")) {
      throw errors.invalidArgument(`workdir must be an absolute path without "..", got ${JSON.stringify(String(w).slice(0, 200))}`);
    }
    out.workdir = w;
  }
  return out;
}

/** Captured layers are named like sandboxes (the provider keeps them under its data dir). */
function validateLayers(layers: unknown): string[] {
  if (layers === undefined || layers === null) return [];
  if (!Array.isArray(layers)) throw errors.invalidArgument("layers must be an array of layer ids");
  if (layers.length > MAX_LAYERS) throw errors.invalidArgument(`a sandbox stacks at most ${MAX_LAYERS} layers, got ${layers.length}`);
  return layers.map((l: unknown) => validateId(String(l)));
}

/** Bound of stacked captured layers (overlay lowers above the snapshot): deeper stacks are squashed. */
export const MAX_LAYERS = 8;

export function memoryBytesOf(spec: SandboxSpec): number {
  return Math.round(spec.memoryGiB * GiB);
}

export function diskBytesOf(spec: SandboxSpec): number | undefined {
  return spec.diskGiB === undefined ? undefined : Math.round(spec.diskGiB * GiB);
}

const NETWORK_MODES: readonly NetworkMode[] = ["none", "full", "allow-list"];
/** The control plane allows 10 (as the reference does); the runner takes a little more. */
const MAX_ALLOW_CIDRS = 64;
const CIDR = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/;

function validateAllowList(list: unknown): string[] {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw errors.invalidArgument("networkAllowList must be an array of IPv4 CIDRs");
  if (list.length > MAX_ALLOW_CIDRS) throw errors.invalidArgument(`networkAllowList must hold at most ${MAX_ALLOW_CIDRS} CIDRs`);
  return list.map((c: unknown) => {
    const m = typeof c === "string" ? CIDR.exec(c) : null;
    if (!m || m.slice(1, 5).some((o) => Number(o) > 255) || Number(m[5]) > 32) {
      throw errors.invalidArgument(`networkAllowList: ${JSON.stringify(c)} is not an IPv4 CIDR (a.b.c.d/n)`);
    }
    return c as string;
  });
}

/** The fields of `r` that are set (a spread of undefined would overwrite the spec's). */
export function definedOf(r: SandboxResources): SandboxResources {
  return Object.fromEntries(Object.entries(r).filter(([, v]) => v !== undefined)) as SandboxResources;
}
