import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";

// Reading what skopeo left in the OCI layout: the manifest it chose (linux/amd64) and the image
// config, both checked against their digests, and the parts of the config a sandbox applies.

export interface ImageConfig {
  /** Environment from the image (later entries win), to merge under the caller's env. */
  env: Record<string, string>;
  /** Absolute working directory, when the image sets one. */
  workdir?: string;
  /** "name", "uid", "uid:gid" or "name:group" as the image says; undefined for the default (root). */
  user?: string;
  entrypoint: string[];
  cmd: string[];
  labels: Record<string, string>;
  os?: string;
  architecture?: string;
}

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

interface Manifest {
  config: Descriptor;
  layers: Descriptor[];
}

const DIGEST = /^sha256:[a-f0-9]{64}$/;

export function parseDescriptor(d: unknown): Descriptor {
  const o = d as Partial<Descriptor> | null;
  if (typeof o !== "object" || o === null || typeof o.digest !== "string" || !DIGEST.test(o.digest) || typeof o.mediaType !== "string") {
    throw errors.failedPrecondition(`the image manifest has an invalid descriptor: ${JSON.stringify(d).slice(0, 200)}`);
  }
  return { mediaType: o.mediaType, digest: o.digest, size: Number(o.size ?? 0) };
}

async function blob(layout: string, digest: string): Promise<Buffer> {
  const data = await readFile(path.join(layout, "blobs", "sha256", digest.slice("sha256:".length)));
  const got = `sha256:${createHash("sha256").update(data).digest("hex")}`;
  if (got !== digest) throw errors.failedPrecondition(`blob ${digest} failed digest verification (hashes to ${got})`);
  return data;
}

function strings(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((s): s is string => typeof s === "string") : [];
}

export async function readImageConfig(layout: string, name: string): Promise<{ manifestDigest: string; manifest: Manifest; config: { config: ImageConfig; diffIds: string[] } }> {
  const index = JSON.parse(await readFile(path.join(layout, "index.json"), "utf8")) as { manifests?: (Descriptor & { annotations?: Record<string, string> })[] };
  const entry = (index.manifests ?? []).find((m) => m.annotations?.["org.opencontainers.image.ref.name"] === name);
  if (!entry) throw errors.failedPrecondition("the pulled image layout has no manifest");
  const manifestDigest = parseDescriptor(entry).digest;
  const raw = JSON.parse((await blob(layout, manifestDigest)).toString("utf8")) as Partial<Manifest>;
  if (!raw.config || !Array.isArray(raw.layers)) throw errors.failedPrecondition(`manifest ${manifestDigest} is not an image manifest`);
  const manifest: Manifest = { config: parseDescriptor(raw.config), layers: raw.layers.map(parseDescriptor) };
  const cfg = JSON.parse((await blob(layout, manifest.config.digest)).toString("utf8")) as {
    os?: string;
    architecture?: string;
    config?: { Env?: unknown; WorkingDir?: unknown; User?: unknown; Entrypoint?: unknown; Cmd?: unknown; Labels?: unknown };
    rootfs?: { diff_ids?: unknown };
  };
  const diffIds = strings(cfg.rootfs?.diff_ids);
  if (diffIds.length !== manifest.layers.length || diffIds.some((d) => !DIGEST.test(d))) {
    throw errors.failedPrecondition(`image config ${manifest.config.digest} lists ${diffIds.length} layer digests for ${manifest.layers.length} layers`);
  }
  const c = cfg.config ?? {};
  const env: Record<string, string> = {};
  for (const kv of strings(c.Env)) {
    const eq = kv.indexOf("=");
    if (eq > 0) env[kv.slice(0, eq)] = kv.slice(eq + 1);
  }
  const labels: Record<string, string> = {};
  if (typeof c.Labels === "object" && c.Labels !== null) {
    for (const [k, v] of Object.entries(c.Labels)) if (typeof v === "string") labels[k] = v;
  }
  const config: ImageConfig = { env, entrypoint: strings(c.Entrypoint), cmd: strings(c.Cmd), labels };
  if (typeof c.WorkingDir === "string" && c.WorkingDir.startsWith("/")) config.workdir = c.WorkingDir;
  if (typeof c.User === "string" && c.User !== "") config.user = c.User;
  if (cfg.os) config.os = cfg.os;
  if (cfg.architecture) config.architecture = cfg.architecture;
  return { manifestDigest, manifest, config: { config, diffIds } };
}
