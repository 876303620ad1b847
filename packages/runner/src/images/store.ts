import { createHash, randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import { acquireDirLock } from "../linux/dir-lock.ts";
import { KeyedLock } from "../host/keyed-lock.ts";
import { parseDescriptor, readImageConfig, type ImageConfig } from "./config.ts";
import { flatten } from "./flatten.ts";
import { DOCKER_HUB, isLoopbackRegistry, parseImageRef, type ImageRef } from "./ref.ts";
import { buildahBuild } from "./buildah.ts";
import { skopeoCopy, skopeoPush, type RegistryCredentials } from "./skopeo.ts";
import { unpackLayer, type Budget, type LayerStats } from "./unpack.ts";

export interface ImageStoreOptions {
  /** The runner's data dir; the store lives in <dataDir>/images. */
  dataDir: string;
  /** host[:port] serving Docker Hub's repositories (unqualified and docker.io names). */
  mirror?: string;
  /** Registries reached over plain HTTP / unverified TLS besides loopback ones. */
  insecureRegistries?: string[];
  /** Caps for one image, all layers together (layer bombs). */
  maxBytes?: number;
  maxFiles?: number;
  log?: (line: string) => void;
}

export interface StoredLayer extends LayerStats {
  /** The layer's directory in overlayfs form (a valid lowerdir). */
  dir: string;
}

export interface Image {
  /** The reference as normalised (registry/repository[:tag][@digest]). */
  ref: string;
  /** Digest of the linux/amd64 manifest: the image's identity on this runner. */
  digest: string;
  /** Plain directory to use as a sandbox's `rootfs` (read-only: the provider overlays it). */
  rootfs: string;
  config: ImageConfig;
  /** Bottom to top. */
  layers: StoredLayer[];
  /** Uncompressed size of all layers (bytes). */
  size: number;
  pulledAt: string;
}

export interface BuildOptions {
  dockerfile: string;
  /** Fills the build context directory (the caller's contexts, e.g. from object storage). */
  context: (dir: string, signal?: AbortSignal) => Promise<void>;
  /** Credentials per registry host the FROM lines pull from (see fromRegistries). */
  credentials: Record<string, RegistryCredentials>;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
  /**
   * Where the built image is pushed once unpacked (registry/repository:tag), with credentials that
   * may push there: the build is recorded as done only once the registry holds it. A cached build
   * is not pushed again (its first build was).
   */
  push?: { image: string; credentials?: RegistryCredentials };
}

export interface PullOptions {
  credentials?: RegistryCredentials;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
  /** Test hook: skopeo's pid once it runs. */
  onSkopeo?: (pid: number) => void;
}

const GiB = 2 ** 30;
const hex = (digest: string) => digest.slice("sha256:".length);
const keyOf = (s: string) => createHash("sha256").update(s).digest("hex").slice(0, 32);

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  await writeFile(tmp, JSON.stringify(value, null, 1));
  await rename(tmp, file);
}

/** rename(2) of a finished directory into place; false when another puller got there first. */
async function publish(from: string, to: string): Promise<boolean> {
  try {
    await rename(from, to);
    return true;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOTEMPTY" || code === "EEXIST") return false;
    throw err;
  }
}

export class ImageStore {
  readonly root: string;
  readonly #o: ImageStoreOptions;
  readonly #lock = new KeyedLock();
  readonly #inflight = new Map<string, Promise<Image>>();
  // Pulls share the store; removal needs it alone (a layer published by a running pull is not yet
  // referenced by any image and would look unused).
  #pulls = 0;
  #removing: Promise<void> | undefined;
  #idle: (() => void) | undefined;

  private constructor(o: ImageStoreOptions) {
    this.#o = o;
    this.root = path.join(o.dataDir, "images");
  }

  /** Opens (creating) the store and removes what pulls that died left in its temp dir. */
  static async open(o: ImageStoreOptions): Promise<ImageStore> {
    const s = new ImageStore(o);
    for (const d of ["layers", "images", "refs", "tmp", "locks", "builds", "buildah"]) await mkdir(path.join(s.root, d), { recursive: true, mode: 0o700 });
    for (const name of await readdir(path.join(s.root, "tmp"))) {
      const pid = Number(name.split("-")[0]);
      if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) await rm(path.join(s.root, "tmp", name), { recursive: true, force: true });
    }
    return s;
  }

  layerDir(diffId: string): string {
    // "sha256-<hex>": a ':' would split an overlay lowerdir list.
    return path.join(this.root, "layers", `sha256-${hex(diffId)}`);
  }

  imageDir(digest: string): string {
    return path.join(this.root, "images", `sha256-${hex(digest)}`);
  }

  #refFile(canonical: string): string {
    return path.join(this.root, "refs", `${keyOf(canonical)}.json`);
  }

  /** The image a reference (or a manifest digest) was last pulled as, if it is on disk. */
  async get(refOrDigest: string): Promise<Image | undefined> {
    if (/^sha256:[a-f0-9]{64}$/.test(refOrDigest)) return this.#image(refOrDigest);
    const text = await readFile(this.#refFile(parseImageRef(refOrDigest).canonical), "utf8").catch(() => undefined);
    if (text === undefined) return undefined;
    const rec = JSON.parse(text) as { ref: string; digest: string; pulledAt: string };
    const image = await this.#image(rec.digest);
    // As this reference saw it: its name and when it was last pulled.
    return image && { ...image, ref: rec.ref, pulledAt: rec.pulledAt };
  }

  async #image(digest: string): Promise<Image | undefined> {
    const text = await readFile(path.join(this.imageDir(digest), "image.json"), "utf8").catch(() => undefined);
    return text === undefined ? undefined : (JSON.parse(text) as Image);
  }

  /**
   * Pulls `ref` (tag or digest) for linux/amd64 and returns the image with its root ready.
   * Concurrent pulls of one reference, in this process or others, do the work once.
   */
  pull(ref: string, options: PullOptions = {}): Promise<Image> {
    let parsed: ImageRef;
    try {
      parsed = parseImageRef(ref);
    } catch (err) {
      return Promise.reject(err as Error);
    }
    const running = this.#inflight.get(parsed.canonical);
    if (running) return running;
    const p = this.#pullLocked(parsed, options).finally(() => this.#inflight.delete(parsed.canonical));
    this.#inflight.set(parsed.canonical, p);
    return p;
  }

  /**
   * Builds a Dockerfile (declarative build) into the store, or answers the image an earlier build
   * of the same `key` made (the caller's build ref: same Dockerfile and contexts). Concurrent
   * builds of one key, in this process or others, do the work once.
   */
  build(key: string, o: BuildOptions): Promise<Image> {
    if (!/^[a-zA-Z0-9_.-]{1,200}$/.test(key)) return Promise.reject(errors.invalidArgument(`build key ${JSON.stringify(key.slice(0, 40))} is not a file name`));
    const running = this.#inflight.get(`build:${key}`);
    if (running) return running;
    const p = (async () => {
      while (this.#removing) await this.#removing;
      this.#pulls++;
      try {
        return await this.#lock.with(`build:${key}`, async () => {
          const release = await acquireDirLock(path.join(this.root, "locks", keyOf(`build:${key}`)), (pid) => o.onProgress?.(`waiting for process ${pid}, which runs the same build`));
          try {
            const have = await this.built(key);
            if (have) {
              o.onProgress?.(`build ${key} is cached as ${have.digest}`);
              return have;
            }
            return await this.#build(key, o);
          } finally {
            await release();
          }
        });
      } finally {
        if (--this.#pulls === 0) this.#idle?.();
      }
    })().finally(() => this.#inflight.delete(`build:${key}`));
    this.#inflight.set(`build:${key}`, p);
    return p;
  }

  /** The image an earlier build of `key` made, if it is still on disk. */
  async built(key: string): Promise<Image | undefined> {
    const text = await readFile(path.join(this.root, "builds", `${key}.json`), "utf8").catch(() => undefined);
    if (text === undefined) return undefined;
    return this.#image((JSON.parse(text) as { digest: string }).digest);
  }

  async #build(key: string, o: BuildOptions): Promise<Image> {
    const progress = (line: string) => {
      o.onProgress?.(line);
      this.#o.log?.(line);
    };
    const tmp = path.join(this.root, "tmp", `${process.pid}-${randomBytes(6).toString("hex")}`);
    await mkdir(tmp, { mode: 0o700 });
    try {
      const context = path.join(tmp, "context");
      await mkdir(context, { mode: 0o755 });
      await o.context(context, o.signal);
      const t0 = Date.now();
      const layout = path.join(tmp, "oci");
      const scratch = path.join(tmp, "scratch");
      await mkdir(scratch, { mode: 0o700 });
      await buildahBuild(o.dockerfile, context, layout, `localhost/sandbar-build:${key.slice(0, 100).toLowerCase()}`, {
        root: path.join(this.root, "buildah", "root"),
        runroot: path.join(this.root, "buildah", "run"),
        scratch,
        mirror: this.#o.mirror,
        insecureRegistries: this.#o.insecureRegistries ?? [],
        credentials: o.credentials,
        signal: o.signal,
        onLine: progress,
      });
      progress(`built in ${Date.now() - t0} ms`);
      const image = await this.#import(`build ${key}`, layout, tmp, progress);
      if (o.push) await this.#push(layout, image, o.push, tmp, o.signal, progress);
      await writeJsonAtomic(path.join(this.root, "builds", `${key}.json`), { digest: image.digest, builtAt: new Date().toISOString() });
      return image;
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  async #push(layout: string, image: Image, push: NonNullable<BuildOptions["push"]>, tmp: string, signal: AbortSignal | undefined, progress: (line: string) => void): Promise<void> {
    const ref = parseImageRef(push.image);
    const insecure = isLoopbackRegistry(ref.registry) || (this.#o.insecureRegistries ?? []).includes(ref.registry);
    const t0 = Date.now();
    progress(`pushing ${image.digest} to ${ref.canonical}`);
    await skopeoPush(layout, "image", ref.canonical, { registry: ref.registry, credentials: push.credentials, insecure, scratch: tmp, signal });
    progress(`pushed to ${ref.canonical} in ${Date.now() - t0} ms`);
  }

  async #pullLocked(ref: ImageRef, o: PullOptions): Promise<Image> {
    while (this.#removing) await this.#removing;
    this.#pulls++;
    try {
      return await this.#pullShared(ref, o);
    } finally {
      if (--this.#pulls === 0) this.#idle?.();
    }
  }

  /** Runs `fn` with no pull in progress in this store (nor starting). */
  async #exclusive<T>(fn: () => Promise<T>): Promise<T> {
    while (this.#removing) await this.#removing;
    let done!: () => void;
    this.#removing = new Promise<void>((r) => (done = r));
    try {
      if (this.#pulls > 0) await new Promise<void>((r) => (this.#idle = r));
      return await fn();
    } finally {
      this.#idle = undefined;
      this.#removing = undefined;
      done();
    }
  }

  async #pullShared(ref: ImageRef, o: PullOptions): Promise<Image> {
    const asked = Date.now();
    if (ref.digest) {
      const have = await this.get(ref.canonical);
      if (have) return have; // a digest never changes content
    }
    return this.#lock.with(ref.canonical, async () => {
      const release = await acquireDirLock(path.join(this.root, "locks", keyOf(ref.canonical)), (pid) => o.onProgress?.(`waiting for process ${pid}, which is pulling ${ref.canonical}`));
      try {
        // Another process finished this pull while we waited: take its result.
        const have = await this.get(ref.canonical);
        if (have && Date.parse(have.pulledAt) >= asked) return have;
        return await this.#pull(ref, o);
      } finally {
        await release();
      }
    });
  }

  async #pull(ref: ImageRef, o: PullOptions): Promise<Image> {
    const progress = (line: string) => {
      o.onProgress?.(line);
      this.#o.log?.(line);
    };
    const hub = ref.registry === DOCKER_HUB;
    const registry = hub && this.#o.mirror ? this.#o.mirror : ref.registry;
    const source = `${registry}/${ref.repository}${ref.tag !== undefined ? `:${ref.tag}` : ""}${ref.digest !== undefined ? `@${ref.digest}` : ""}`;
    const insecure = isLoopbackRegistry(registry) || (this.#o.insecureRegistries ?? []).includes(registry);
    const tmp = path.join(this.root, "tmp", `${process.pid}-${randomBytes(6).toString("hex")}`);
    await mkdir(tmp, { mode: 0o700 });
    try {
      const layout = path.join(tmp, "oci");
      progress(`pulling ${ref.canonical}${registry !== ref.registry ? ` from ${registry}` : ""}`);
      await skopeoCopy(source, layout, "image", { registry, credentials: o.credentials, insecure, scratch: tmp, signal: o.signal, onSpawn: o.onSkopeo });
      const fetched = Date.now();

      const image = await this.#import(ref.canonical, layout, tmp, progress, fetched);
      return await this.#record(ref, image);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  /**
   * Unpacks image "image" of the OCI layout `layout` (inside the temp dir `tmp`) into the store:
   * layers not yet present, then the image's root; answers the stored image.
   */
  async #import(label: string, layout: string, tmp: string, progress: (line: string) => void, fetched = Date.now()): Promise<Image> {
    const { manifestDigest, manifest, config } = await readImageConfig(layout, "image");
    const done = await this.#image(manifestDigest);
    if (done) return done;

    const budget: Budget = { bytes: this.#o.maxBytes ?? 20 * GiB, files: this.#o.maxFiles ?? 2_000_000 };
    const layers: StoredLayer[] = [];
    for (const [i, desc] of manifest.layers.entries()) {
      const diffId = config.diffIds[i];
      const dir = this.layerDir(diffId);
      let stats: LayerStats | undefined = await readFile(path.join(dir, "layer.json"), "utf8").then(
        (t) => JSON.parse(t) as LayerStats,
        () => undefined,
      );
      if (stats === undefined) {
        const work = path.join(tmp, `layer-${i}`);
        await mkdir(path.join(work, "diff"), { recursive: true, mode: 0o755 });
        const blob = path.join(layout, "blobs", "sha256", hex(parseDescriptor(desc).digest));
        stats = await unpackLayer({ blob, mediaType: desc.mediaType, blobDigest: desc.digest, diffId, target: path.join(work, "diff"), budget });
        await writeJsonAtomic(path.join(work, "layer.json"), stats);
        await publish(work, dir);
        progress(`layer ${i + 1}/${manifest.layers.length} ${diffId.slice(0, 19)} unpacked (${stats.files} entries, ${stats.bytes} bytes)`);
      } else {
        progress(`layer ${i + 1}/${manifest.layers.length} ${diffId.slice(0, 19)} already present`);
      }
      budget.bytes -= stats.bytes;
      budget.files -= stats.files;
      if (budget.bytes < 0 || budget.files < 0) throw errors.resourceExhausted(`image ${label} is too large: over the runner's cap of ${this.#o.maxBytes ?? 20 * GiB} bytes or ${this.#o.maxFiles ?? 2_000_000} files`);
      layers.push({ ...stats, dir: path.join(dir, "diff") });
    }
    const unpacked = Date.now();

    const work = path.join(tmp, "image");
    await mkdir(work, { mode: 0o700 });
    await flatten(layers, path.join(work, "rootfs"));
    await ensureMountPoints(path.join(work, "rootfs"));
    const image: Image = {
      ref: label,
      digest: manifestDigest,
      rootfs: path.join(this.imageDir(manifestDigest), "rootfs"),
      config: config.config,
      layers,
      size: layers.reduce((n, l) => n + l.bytes, 0),
      pulledAt: new Date().toISOString(),
    };
    await writeJsonAtomic(path.join(work, "image.json"), image);
    await publish(work, this.imageDir(manifestDigest));
    progress(`${label} ready as ${manifestDigest} (unpack ${unpacked - fetched} ms, root ${Date.now() - unpacked} ms)`);
    return (await this.#image(manifestDigest)) ?? image;
  }

  async #record(ref: ImageRef, image: Image): Promise<Image> {
    const pulledAt = new Date().toISOString();
    await writeJsonAtomic(this.#refFile(ref.canonical), { ref: ref.canonical, digest: image.digest, pulledAt });
    return { ...image, ref: ref.canonical, pulledAt };
  }

  /**
   * Removes an image's root (the caller knows no sandbox uses it), then layers no image uses.
   * Waits for this store's pulls; another process's pull must not run meanwhile (one store per
   * runner data dir).
   */
  remove(digest: string): Promise<void> {
    return this.#exclusive(async () => {
      await this.#removeImage(digest);
      await this.#collect();
    });
  }

  /** Deletes layer directories that no image on disk refers to. */
  collectLayers(): Promise<string[]> {
    return this.#exclusive(() => this.#collect());
  }

  async #removeImage(digest: string): Promise<void> {
    for (const name of await readdir(path.join(this.root, "refs"))) {
      const file = path.join(this.root, "refs", name);
      const rec = await readFile(file, "utf8").then((t) => JSON.parse(t) as { digest?: string }, () => undefined);
      if (rec?.digest === digest) await rm(file, { force: true });
    }
    for (const name of await readdir(path.join(this.root, "builds"))) {
      const file = path.join(this.root, "builds", name);
      const rec = await readFile(file, "utf8").then((t) => JSON.parse(t) as { digest?: string }, () => undefined);
      if (rec?.digest === digest) await rm(file, { force: true });
    }
    const dir = this.imageDir(digest);
    const trash = path.join(this.root, "tmp", `${process.pid}-rm-${randomBytes(4).toString("hex")}`);
    if (await exists(dir)) {
      await rename(dir, trash);
      await rm(trash, { recursive: true, force: true });
    }
  }

  async #collect(): Promise<string[]> {
    const used = new Set<string>();
    for (const name of await readdir(path.join(this.root, "images"))) {
      const text = await readFile(path.join(this.root, "images", name, "image.json"), "utf8").catch(() => undefined);
      if (text) for (const l of (JSON.parse(text) as Image).layers) used.add(`sha256-${hex(l.diffId)}`);
    }
    const removed: string[] = [];
    for (const name of await readdir(path.join(this.root, "layers"))) {
      if (used.has(name)) continue;
      const trash = path.join(this.root, "tmp", `${process.pid}-rm-${randomBytes(4).toString("hex")}`);
      await rename(path.join(this.root, "layers", name), trash);
      await rm(trash, { recursive: true, force: true });
      removed.push(name);
    }
    return removed;
  }
}

/** Directories bubblewrap and the provider mount over; scratch images may lack them. */
async function ensureMountPoints(rootfs: string): Promise<void> {
  const { lstat, chmod } = await import("node:fs/promises");
  for (const [d, mode] of [["proc", 0o555], ["dev", 0o755], ["sys", 0o555], ["tmp", 0o1777], ["etc", 0o755], ["run", 0o755]] as const) {
    const p = path.join(rootfs, d);
    const st = await lstat(p).catch(() => undefined);
    if (st === undefined) {
      await mkdir(p);
      await chmod(p, mode);
    }
  }
}
