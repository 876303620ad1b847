// OCI images -> sandbox root filesystems, on the runner.
//
// Flow: parseImageRef (the reference's 400 rules: tag or digest required, ":latest" refused) ->
// skopeo copies the linux/amd64 image (index resolved, basic or bearer-token auth from the
// registry's challenge, blob digests verified; credentials in a 0600 auth file, never argv) into
// a per-pull OCI layout under tmp/ -> each layer not yet on disk is unpacked by unpack.ts (node-tar
// parses, we write: both digests re-checked while streaming, no absolute paths / ".." / writes
// through symlinks / device nodes, caps on bytes and entries) -> the image's root is built.
//
// On disk (<dataDir>/images):
//   layers/sha256-<diffId hex>/diff/       one per uncompressed layer digest, shared by every image
//                                          that has it; overlayfs form (whiteouts = 0/0 char devices,
//                                          opaque dirs = trusted.overlay.opaque=y): a valid lowerdir
//   layers/sha256-<hex>/layer.json         digests, size, entry count, whiteout and opaque lists
//   images/sha256-<manifest hex>/rootfs/   the merged root: hard links into the layer dirs
//   images/sha256-<manifest hex>/image.json  the Image record (config, layers, size)
//   refs/<hash of ref>.json                which manifest a reference was last pulled as
//   tmp/<pid>-<random>/                    everything in progress; renamed into place when whole,
//                                          removed at open() when its pid is dead
//   locks/<hash of ref>/                   cross-process pull lock (dir-lock.ts; dead owners broken)
// ("sha256-" not "sha256:": a ':' would split an overlay lowerdir list.)
//
// Why a hard-link root rather than an overlay of the layer dirs: the provider already overlays
// spec.rootfs (one plain directory) with the sandbox's upper dir. A read-only overlay of layers
// below it would be a long-lived mount per image to restore after every reboot and to leak on
// crashes, a second overlay level (the stacking limit is 2, so a runner inside a container on
// overlay storage would break), and lowerdir strings that grow with layer count. The link farm is
// a plain directory: bytes stay shared with the layer store (same inode, checked by the tests),
// only directories and symlinks are duplicated, building it costs metadata only (ms for a few
// thousand files), and overlay copy-up never writes into a lower, so the shared inodes stay
// pristine. The layer dirs stay valid lowerdirs, so a provider that accepts a lower stack
// (`lowers` below, top first) can switch without re-pulling.
//
// The interface the control-side snapshot service calls (through the runner protocol):
//   const store = await ImageStore.open({ dataDir, mirror, insecureRegistries, maxBytes, maxFiles })
//   parseImageRef(name)                  -> ImageRef; throws invalidArgument with the reference's text
//   store.pull(name, { credentials, signal, onProgress }) -> Image   (snapshot: pending -> pulling -> active;
//        errors: invalidArgument (bad name, refused layer), notFound (unknown image/tag),
//        permissionDenied (registry auth), resourceExhausted (layer bomb), unavailable (unreachable,
//        interrupted), failedPrecondition (digest mismatch, no linux/amd64) -> snapshot `error` + errorReason)
//   store.get(nameOrDigest)              -> Image | undefined   (is it on this runner?)
//   store.remove(digest)                 -> drops the root and the layers no other image uses
//   sandboxSpecFor(image, spec)          -> the spec's rootfs and env (image env under the caller's)
// Image.size (bytes) feeds the snapshot's `size` (GB) and the maxSnapshotSize check; Image.config
// gives entrypoint/cmd/workdir/user for the snapshot row and the sandbox.

import type { SandboxSpec } from "../provider.ts";
import type { Image } from "./store.ts";

export type { ImageConfig } from "./config.ts";
export { DOCKER_HUB, isLoopbackRegistry, parseImageRef, type ImageRef } from "./ref.ts";
export type { RegistryCredentials } from "./skopeo.ts";
export { BuildFailed, fromRegistries } from "./buildah.ts";
export { imageUser } from "./user.ts";
export { exportImage, type ExportedImage, type ExportLayer } from "./export.ts";
export { sandboxUser } from "../host/rootprep.ts";
export { ImageStore, type BuildOptions, type Image, type ImageStoreOptions, type PullOptions, type StoredLayer } from "./store.ts";

/** Layer dirs top first, as an overlay lowerdir list wants them. */
export function lowers(image: Image): string[] {
  return image.layers.map((l) => l.dir).reverse();
}

/** `spec` booting from `image`: its root, its env under the caller's (the caller wins), its WORKDIR unless the caller names one. */
export function sandboxSpecFor(image: Image, spec: Omit<SandboxSpec, "rootfs">): SandboxSpec {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(image.config.env)) if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) && !v.includes("\0")) env[k] = v;
  const out: SandboxSpec = { ...spec, rootfs: image.rootfs, env: { ...env, ...spec.env } };
  const workdir = spec.workdir ?? image.config.workdir;
  if (workdir !== undefined) out.workdir = workdir;
  return out;
}
