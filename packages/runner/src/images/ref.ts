import { errors } from "@sandbar/protocol";

// Image references as the reference API accepts them for snapshots: a tag or a digest is
// required and ":latest" is refused (a snapshot must not move under its users). The messages are
// the reference's 400 texts, so control can pass them through unchanged.

export interface ImageRef {
  /** Registry host[:port] as given or implied ("docker.io" for unqualified names). */
  registry: string;
  /** Repository path inside the registry ("library/python" for "python"). */
  repository: string;
  tag?: string;
  /** "sha256:<64 hex>" when pinned. */
  digest?: string;
  /** The normalised reference: registry/repository[:tag][@digest]. */
  canonical: string;
}

export const DOCKER_HUB = "docker.io";

// Lower-case path components separated by single slashes (the reference's regex), then an
// optional tag and an optional digest.
const NAME = /^[a-z0-9]+(?:[._-][a-z0-9]+|__)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const HOST = /^(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;

const BAD_NAME = "Invalid image name format. Must be lowercase, may contain digits, dots, dashes, and single slashes between components";

export function parseImageRef(input: unknown): ImageRef {
  if (typeof input !== "string" || input.trim() === "") throw errors.invalidArgument("Image name is required");
  const ref = input.trim();
  if (ref.length > 1024 || /[\s\0]/.test(ref)) throw errors.invalidArgument(BAD_NAME);
  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw errors.invalidArgument("Invalid digest format. Must be image@sha256:64_hex_characters");
  }
  let tag: string | undefined;
  const colon = rest.lastIndexOf(":");
  if (colon > rest.lastIndexOf("/")) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw errors.invalidArgument(BAD_NAME);
  }
  if (tag === "latest") throw errors.invalidArgument('Images with tag ":latest" are not allowed');
  if (tag === undefined && digest === undefined) {
    throw errors.invalidArgument("Image name must include a tag (e.g., ubuntu:22.04) or digest (@sha256:...)");
  }
  // The first component is a registry when it looks like a host (a dot, a port or "localhost").
  const slash = rest.indexOf("/");
  let registry = DOCKER_HUB;
  let repository = rest;
  if (slash > 0) {
    const first = rest.slice(0, slash);
    if (first.includes(".") || first.includes(":") || first === "localhost" || first.startsWith("[")) {
      if (!HOST.test(first)) throw errors.invalidArgument(BAD_NAME);
      registry = first.toLowerCase();
      repository = rest.slice(slash + 1);
    }
  }
  if (registry === "index.docker.io" || registry === "registry-1.docker.io") registry = DOCKER_HUB;
  if (!NAME.test(repository) || repository.length > 255) throw errors.invalidArgument(BAD_NAME);
  if (registry === DOCKER_HUB && !repository.includes("/")) repository = `library/${repository}`;
  const canonical = `${registry}/${repository}${tag !== undefined ? `:${tag}` : ""}${digest !== undefined ? `@${digest}` : ""}`;
  const out: ImageRef = { registry, repository, canonical };
  if (tag !== undefined) out.tag = tag;
  if (digest !== undefined) out.digest = digest;
  return out;
}

/** True for hosts on the loopback range: plain HTTP is accepted there without configuration. */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.startsWith("[") ? registry.slice(1, registry.indexOf("]")) : registry.split(":")[0];
  return host === "localhost" || host === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
