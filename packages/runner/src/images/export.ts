import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { createWriteStream, type Stats } from "node:fs";
import { copyFile, link, lstat, mkdir, open, readdir, readFile, readlink, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { promisify } from "node:util";
import { createGzip } from "node:zlib";
import { Header, Pax } from "tar";
import type { ImageConfig } from "./config.ts";
import { isLoopbackRegistry, parseImageRef } from "./ref.ts";
import { type RegistryCredentials, skopeoPush } from "./skopeo.ts";

// A snapshot of a running sandbox as an OCI image, so runners that lack its captured layers pull
// it (DESIGN.md decision 19: snapshots that must travel become OCI images in the internal
// registry). Every layer comes from a directory in overlayfs form (an image store layer, a captured
// layer, or the default root filesystem whole) and is written as an OCI layer tar: a whiteout
// (0/0 character device) becomes an empty `.wh.<name>`, an opaque directory
// (trusted.overlay.opaque=y) gets a `.wh..wh..opq` inside it. Each tar is streamed through sha256
// (its diff id), gzip and sha256 again (its blob digest) into a file of the OCI layout, never held
// in memory; base layers are cached by content key so they are made once per base. skopeo pushes
// the layout (--preserve-digests: the manifest digest we computed is the one the registry serves).

/** A directory in overlayfs form to export as one layer. */
export interface ExportLayer {
  dir: string;
  /** Files owned by host uid `from` (a captured layer's author) are written as `to` (the user inside). */
  owner?: { from: number; to: { uid: number; gid: number } };
  /** Base layers: their blob is kept under this key and reused by later exports. */
  cacheKey?: string;
}

export interface ExportImageOptions {
  /** Bottom first. */
  layers: ExportLayer[];
  config: ImageConfig;
  /** Where cached base blobs live. */
  cacheDir: string;
  /** A scratch dir of this export (removed by the caller). */
  tmp: string;
  /** registry/repository:tag to push to, with credentials that may push there. */
  push: { image: string; credentials?: RegistryCredentials };
  insecureRegistries?: readonly string[];
  signal?: AbortSignal;
}

export interface ExportedImage {
  /** The manifest digest the registry serves the image by. */
  digest: string;
  layers: number;
  /** Compressed bytes of every layer blob. */
  bytes: number;
}

const BLOCK = 512;
const CHUNK = 64 * 1024;
const LAYER = "application/vnd.oci.image.layer.v1.tar+gzip";
const run = promisify(execFile);

interface Blob {
  digest: string;
  diffId: string;
  size: number;
}

export async function exportImage(o: ExportImageOptions): Promise<ExportedImage> {
  const layout = path.join(o.tmp, "oci");
  const blobs = path.join(layout, "blobs", "sha256");
  await mkdir(blobs, { recursive: true, mode: 0o700 });
  await mkdir(o.cacheDir, { recursive: true, mode: 0o700 });
  const made: Blob[] = [];
  for (const l of o.layers) made.push(l.cacheKey ? await cachedLayer(l, o.cacheDir, blobs) : await writeLayer(l, blobs));
  const config = Buffer.from(JSON.stringify(ociConfig(o.config, made.map((b) => b.diffId))));
  const configDigest = await writeBlob(blobs, config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: configDigest, size: config.length },
      layers: made.map((b) => ({ mediaType: LAYER, digest: b.digest, size: b.size })),
    }),
  );
  const digest = await writeBlob(blobs, manifest);
  await writeFile(path.join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  await writeFile(path.join(layout, "index.json"), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: "application/vnd.oci.image.manifest.v1+json", digest, size: manifest.length, annotations: { "org.opencontainers.image.ref.name": "image" } }] }));
  const ref = parseImageRef(o.push.image);
  const insecure = isLoopbackRegistry(ref.registry) || (o.insecureRegistries ?? []).includes(ref.registry);
  const scratch = path.join(o.tmp, "scratch");
  await mkdir(scratch, { mode: 0o700 });
  await skopeoPush(layout, "image", ref.canonical, { registry: ref.registry, credentials: o.push.credentials, insecure, scratch, signal: o.signal });
  return { digest, layers: made.length, bytes: made.reduce((n, b) => n + b.size, 0) };
}

/** The OCI config: the base's user, env, workdir, entrypoint and cmd over these layers. */
function ociConfig(c: ImageConfig, diffIds: string[]) {
  const config: Record<string, unknown> = { Env: Object.entries(c.env).map(([k, v]) => `${k}=${v}`), Entrypoint: c.entrypoint, Cmd: c.cmd, Labels: c.labels };
  if (c.user) config.User = c.user;
  if (c.workdir) config.WorkingDir = c.workdir;
  return { architecture: "amd64", os: "linux", created: new Date().toISOString(), config, rootfs: { type: "layers", diff_ids: diffIds } };
}

async function writeBlob(blobs: string, data: Buffer): Promise<string> {
  const hex = createHash("sha256").update(data).digest("hex");
  await writeFile(path.join(blobs, hex), data);
  return `sha256:${hex}`;
}

/** A base layer's blob from the cache (made there first when absent), linked into the layout. */
async function cachedLayer(l: ExportLayer, cacheDir: string, blobs: string): Promise<Blob> {
  const key = l.cacheKey!.replace(/[^a-zA-Z0-9_.-]/g, "_");
  const meta = path.join(cacheDir, `${key}.json`);
  let blob = await readFile(meta, "utf8").then((t) => JSON.parse(t) as Blob, () => undefined);
  const file = (b: Blob) => path.join(cacheDir, b.digest.slice("sha256:".length));
  if (!blob || !(await lstat(file(blob)).catch(() => undefined))) {
    blob = await writeLayer(l, cacheDir);
    const t = `${meta}.${process.pid}.tmp`;
    await writeFile(t, JSON.stringify(blob));
    await rename(t, meta);
  }
  const to = path.join(blobs, blob.digest.slice("sha256:".length));
  await link(file(blob), to).catch(() => copyFile(file(blob), to));
  return blob;
}

/** Streams `l.dir` as an OCI layer tar through gzip into `<dir>/<digest hex>`. */
async function writeLayer(l: ExportLayer, dir: string): Promise<Blob> {
  const opaque = await opaqueDirs(l.dir);
  const diff = createHash("sha256");
  const blob = createHash("sha256");
  let size = 0;
  const partial = path.join(dir, `.partial-${process.pid}-${Math.random().toString(16).slice(2)}`);
  try {
    await pipeline(
      Readable.from(layerTar(l, opaque), { objectMode: false, highWaterMark: CHUNK }),
      tap((c) => diff.update(c)),
      createGzip({ level: 1 }),
      tap((c) => {
        blob.update(c);
        size += c.length;
      }),
      createWriteStream(partial, { mode: 0o600 }),
    );
    const hex = blob.digest("hex");
    await rename(partial, path.join(dir, hex));
    return { digest: `sha256:${hex}`, diffId: `sha256:${diff.digest("hex")}`, size };
  } catch (err) {
    await rm(partial, { force: true });
    throw err;
  }
}

function tap(fn: (c: Buffer) => void): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      fn(chunk);
      cb(null, chunk);
    },
  });
}

/** Directories of `root` carrying trusted.overlay.opaque=y (one getfattr for the tree). */
async function opaqueDirs(root: string): Promise<Set<string>> {
  // -d -m: only entries carrying it are printed, silently for the others; -P: symlinks not followed.
  const { stdout } = await run("getfattr", ["-R", "-P", "--absolute-names", "-d", "-m", "^trusted\\.overlay\\.opaque$", "-e", "text", "--", root], { maxBuffer: 256 << 20 });
  const out = new Set<string>();
  let file: string | undefined;
  for (const line of stdout.split("\n")) {
    if (line.startsWith("# file: ")) file = line.slice(8);
    else if (file && line === 'trusted.overlay.opaque="y"') out.add(path.resolve(file));
  }
  return out;
}

const isWhiteout = (st: Stats) => st.isCharacterDevice() && st.rdev === 0;

async function* layerTar(l: ExportLayer, opaque: ReadonlySet<string>): AsyncGenerator<Buffer> {
  const root = path.resolve(l.dir);
  const owner = (st: Stats) => {
    const o = l.owner;
    return { uid: o && st.uid === o.from ? o.to.uid : st.uid, gid: o && st.gid === o.from ? o.to.gid : st.gid };
  };
  // Depth first, names sorted: the same bytes for the same tree (a cached base's blob is stable).
  async function* walk(dir: string, rel: string): AsyncGenerator<Buffer> {
    const names = (await readdir(dir).catch(() => [] as string[])).sort();
    for (const name of names) {
      const host = path.join(dir, name);
      const r = rel ? `${rel}/${name}` : name;
      const st = await lstat(host).catch(() => undefined);
      if (!st) continue; // vanished
      if (isWhiteout(st)) {
        yield header({ path: rel ? `${rel}/.wh.${name}` : `.wh.${name}`, type: "File", mode: 0o644, size: 0, mtime: st.mtime, uid: 0, gid: 0 });
      } else if (st.isDirectory()) {
        yield header({ path: `${r}/`, type: "Directory", mode: st.mode, size: 0, mtime: st.mtime, ...owner(st) });
        if (opaque.has(host)) yield header({ path: `${r}/.wh..wh..opq`, type: "File", mode: 0o644, size: 0, mtime: st.mtime, uid: 0, gid: 0 });
        yield* walk(host, r);
      } else if (st.isSymbolicLink()) {
        const target = await readlink(host).catch(() => undefined);
        if (target !== undefined) yield header({ path: r, type: "SymbolicLink", mode: st.mode, size: 0, mtime: st.mtime, linkpath: target, ...owner(st) });
      } else if (st.isFile()) {
        yield* file(host, r, st, owner(st));
      }
      // Sockets, fifos and device nodes are left out (a sandbox cannot make devices).
    }
  }
  yield* walk(root, "");
  yield Buffer.alloc(BLOCK * 2);
}

async function* file(host: string, rel: string, st: Stats, own: { uid: number; gid: number }): AsyncGenerator<Buffer> {
  const fh = await open(host, "r").catch(() => undefined);
  if (!fh) return;
  try {
    // The size is fixed by the header: a file that shrinks meanwhile is padded, one that grows cut.
    const size = st.size;
    yield header({ path: rel, type: "File", mode: st.mode, size, mtime: st.mtime, ...own });
    let sent = 0;
    while (sent < size) {
      const buf = Buffer.allocUnsafe(Math.min(CHUNK, size - sent));
      const { bytesRead } = await fh.read(buf, 0, buf.length, sent);
      if (bytesRead === 0) {
        yield Buffer.alloc(size - sent);
        break;
      }
      sent += bytesRead;
      yield bytesRead === buf.length ? buf : buf.subarray(0, bytesRead);
    }
    if (size % BLOCK !== 0) yield Buffer.alloc(BLOCK - (size % BLOCK));
  } finally {
    await fh.close();
  }
}

function header(f: { path: string; type: "File" | "Directory" | "SymbolicLink"; mode: number; size: number; mtime: Date; uid: number; gid: number; linkpath?: string }): Buffer {
  const data = { ...f, mode: f.mode & 0o7777, uname: "", gname: "" };
  const h = new Header(data);
  const block = Buffer.alloc(BLOCK);
  // Long paths and link targets, big ids or sizes go in a PAX header before the entry.
  const needPax = h.encode(block, 0);
  return needPax ? Buffer.concat([new Pax({ path: data.path, linkpath: data.linkpath, size: data.size, mtime: data.mtime, uid: data.uid, gid: data.gid }).encode(), block]) : block;
}
