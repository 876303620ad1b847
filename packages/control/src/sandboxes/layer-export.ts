import { createHash, randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { SandboxProvider } from "@sandbar/runner";
import type { Snapshot } from "@sandbar/runner/linux";
import { exportImage, type ExportLayer, type ImageConfig, type ImageStore, sandboxUser } from "@sandbar/runner/images";
import type { LayerExport } from "@sandbar/runner/runtime";

// The runner side of a snapshot that travels (DESIGN.md decision 19): its captured layers over
// its base as an OCI image, pushed where control says (the internal registry). The base is the
// image's own layers as the image store keeps them (unpacked, overlayfs form: written back as
// layer tars), or the default snapshot's root as one layer; their blobs are cached under
// `<images>/exports` by content key, so a base is compressed once whatever the number of exports.

/** The default snapshot's environment, for the config of an image made on it. */
const DEFAULT_CONFIG: ImageConfig = { env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" }, entrypoint: [], cmd: [], labels: {} };

export interface LayerExportHost {
  provider: SandboxProvider;
  images: () => Promise<ImageStore>;
  defaultSnapshot: () => Promise<Snapshot>;
  insecureRegistries?: readonly string[];
  log: (line: string) => void;
}

export async function exportLayers(host: LayerExportHost, req: LayerExport): Promise<{ digest: string; layers: number; bytes: number }> {
  const source = host.provider.layerSource?.bind(host.provider);
  if (!source) throw errors.invalidArgument(`Snapshots of a running sandbox are not exported by the ${host.provider.name} provider`);
  if (req.layers.length === 0) throw errors.invalidArgument("no layers to export");
  const store = await host.images();
  let base: ExportLayer[];
  let config: ImageConfig;
  let baseRoot: string;
  if (req.image) {
    const image = await store.get(req.image);
    if (!image) throw errors.failedPrecondition(`The image ${req.image} is not on this host any more`);
    base = image.layers.map((l) => ({ dir: l.dir, cacheKey: `layer-${l.diffId}` }));
    config = image.config;
    baseRoot = image.rootfs;
  } else {
    const snap = await host.defaultSnapshot();
    // That root binds the host's /usr at start: without it the image would lack its programs.
    if (snap.kind !== "debootstrap") throw errors.failedPrecondition("This runner's default snapshot binds the host's /usr: a snapshot made on it cannot become an image");
    base = [{ dir: snap.rootfs, cacheKey: `default-${createHash("sha256").update(snap.rootfs).digest("hex").slice(0, 32)}` }];
    config = DEFAULT_CONFIG;
    baseRoot = snap.rootfs;
  }
  const user = await sandboxUser(baseRoot, req.user);
  const captured: ExportLayer[] = [];
  // Bottom first, as a manifest lists them.
  for (const id of [...req.layers].reverse()) {
    const l = await source(id);
    captured.push({ dir: l.root, owner: { from: l.uid, to: { uid: user.uid, gid: user.gid } } });
  }
  const tmp = path.join(store.root, "tmp", `${process.pid}-export-${randomBytes(6).toString("hex")}`);
  await mkdir(tmp, { recursive: true, mode: 0o700 });
  const t0 = Date.now();
  try {
    const out = await exportImage({ layers: [...base, ...captured], config, cacheDir: path.join(store.root, "exports"), tmp, push: req.push, insecureRegistries: host.insecureRegistries });
    host.log(`exported layers ${req.layers.join(",")} as ${out.digest} (${out.layers} layers, ${out.bytes} bytes) to ${req.push.image} in ${Date.now() - t0} ms`);
    return out;
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}
