import { spawn } from "node:child_process";
import { createHash, type Hash } from "node:crypto";
import { createReadStream } from "node:fs";
import { chmodSync, closeSync, constants, fchmodSync, fchownSync, futimesSync, lchownSync, linkSync, lstatSync, lutimesSync, mkdirSync, openSync, rmSync, symlinkSync, writeSync, type Stats } from "node:fs";
import { lutimes } from "node:fs/promises";
import path from "node:path";
import { PassThrough, Transform, type TransformCallback } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGunzip, createZstdDecompress } from "node:zlib";
import { ConnectError } from "@sandbar/protocol";
import { errors } from "@sandbar/protocol";
import { Parser, type ReadEntry } from "tar";

// One layer blob -> one directory in overlayfs form: whiteouts (".wh.<name>") become 0/0 character
// devices and opaque markers (".wh..wh..opq") the trusted.overlay.opaque xattr, so the directory is
// a valid overlay lowerdir. Entries are written by us (node-tar only parses), which is where the
// rules live: no absolute paths, no "..", nothing written through a symlink, no device nodes, and
// caps on bytes and entries. Both digests are checked as the bytes stream: the blob's (the
// manifest's) and the uncompressed one (the config's diff_id).

export interface Budget {
  /** Uncompressed bytes still allowed (tar stream size). */
  bytes: number;
  /** Entries still allowed. */
  files: number;
}

export interface LayerStats {
  /** Uncompressed digest (the config's diff_id): the layer's identity on disk. */
  diffId: string;
  /** The compressed blob's digest as the manifest names it. */
  blobDigest: string;
  bytes: number;
  files: number;
  /** Paths (relative, no leading slash) this layer deletes from the layers below. */
  whiteouts: string[];
  /** Directories whose lower contents this layer hides. */
  opaque: string[];
}

export interface UnpackInput {
  blob: string;
  mediaType: string;
  blobDigest: string;
  diffId: string;
  /** Empty directory to fill. */
  target: string;
  budget: Budget;
}

function refuse(layer: string, why: string): Error {
  return errors.invalidArgument(`layer ${layer} is refused: ${why}`);
}

function decompressor(mediaType: string): Transform {
  if (/gzip$/.test(mediaType)) return createGunzip();
  if (/zstd$/.test(mediaType)) return createZstdDecompress();
  if (/tar$/.test(mediaType)) return new PassThrough();
  throw errors.invalidArgument(`layer media type ${mediaType} is not supported (tar, tar+gzip or tar+zstd)`);
}

class Tap extends Transform {
  total = 0;
  readonly hash: Hash;
  readonly cap: { limit: number; onOver: () => Error } | undefined;
  constructor(hash: Hash, cap?: { limit: number; onOver: () => Error }) {
    super();
    this.hash = hash;
    this.cap = cap;
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.total += chunk.length;
    this.hash.update(chunk);
    if (this.cap && this.total > this.cap.limit) return cb(this.cap.onOver());
    cb(null, chunk);
  }
}

/** Relative, normalised path of an archive member; throws on absolute paths and "..". */
function memberPath(layer: string, raw: string): string {
  if (raw.startsWith("/")) throw refuse(layer, `member ${JSON.stringify(raw)} has an absolute path`);
  const parts = raw.split("/").filter((c) => c !== "" && c !== ".");
  if (parts.includes("..")) throw refuse(layer, `member ${JSON.stringify(raw)} escapes the layer ("..")`);
  return parts.join("/");
}

function lstatOrUndefined(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

/**
 * Directories of one layer known to be real (made or checked by us). Only we write the layer's
 * tree, so a checked directory stays one until a later member replaces it (forget()).
 */
class SafeDirs {
  readonly #known = new Set<string>([""]);
  readonly layer: string;
  readonly root: string;
  constructor(layer: string, root: string) {
    this.layer = layer;
    this.root = root;
  }

  /** mkdir -p of `rel` under the root, refusing to pass through anything but real directories. */
  ensure(rel: string): void {
    if (this.#known.has(rel)) return;
    let cur = "";
    for (const c of rel.split("/")) {
      cur = cur === "" ? c : `${cur}/${c}`;
      if (this.#known.has(cur)) continue;
      const full = path.join(this.root, cur);
      const st = lstatOrUndefined(full);
      if (st === undefined) mkdirSync(full, { mode: 0o755 });
      else if (st.isSymbolicLink()) throw refuse(this.layer, `a member is written through the symbolic link ${cur}`);
      else if (!st.isDirectory()) throw refuse(this.layer, `a member is written below ${cur}, which is not a directory`);
      this.#known.add(cur);
    }
  }

  /** True when every component of `rel` is a real directory (creates nothing). */
  isRealDir(rel: string): boolean {
    let cur = "";
    for (const c of rel.split("/").filter(Boolean)) {
      cur = cur === "" ? c : `${cur}/${c}`;
      if (this.#known.has(cur)) continue;
      const st = lstatOrUndefined(path.join(this.root, cur));
      if (!st?.isDirectory()) return false;
      this.#known.add(cur);
    }
    return true;
  }

  add(rel: string): void {
    this.#known.add(rel);
  }

  /** `rel` is being replaced: neither it nor anything below it is known any more. */
  forget(rel: string): void {
    for (const k of this.#known) if (k === rel || k.startsWith(`${rel}/`)) this.#known.delete(k);
  }
}

const WHITEOUT = ".wh.";
const OPAQUE = ".wh..wh..opq";

export async function unpackLayer(input: UnpackInput): Promise<LayerStats> {
  const { target, blobDigest } = input;
  const layer = blobDigest;
  const whiteouts = new Set<string>();
  const opaque = new Set<string>();
  const dirTimes: { p: string; mtime: Date }[] = [];
  let files = 0;
  let failure: Error | undefined;
  let queue = 0;
  let chain: Promise<void> = Promise.resolve();

  const dirs = new SafeDirs(layer, target);
  // Synchronous syscalls: each is microseconds, and a layer has tens of thousands of them; the
  // event loop still turns between members (they arrive as stream events).
  const handle = async (entry: ReadEntry): Promise<void> => {
    if (++files > input.budget.files) throw errors.resourceExhausted(`image is too large: more than ${input.budget.files} files (a layer bomb?); layer ${layer}`);
    const rel = memberPath(layer, entry.path);
    const base = path.posix.basename(rel);
    const parent = path.posix.dirname(rel) === "." ? "" : path.posix.dirname(rel);
    if (base === OPAQUE) {
      dirs.ensure(parent);
      opaque.add(parent);
      return;
    }
    if (base.startsWith(WHITEOUT)) {
      const name = base.slice(WHITEOUT.length);
      if (name.startsWith(".wh.") || name === "" || name === "." || name === "..") return; // AUFS metadata
      dirs.ensure(parent);
      whiteouts.add(parent ? `${parent}/${name}` : name);
      return;
    }
    if (rel === "") {
      if (entry.type === "Directory") return; // "./": the layer root is ours
      throw refuse(layer, "a member replaces the layer's root directory");
    }
    dirs.ensure(parent);
    const full = path.join(target, rel);
    const existing = lstatOrUndefined(full);
    const type = entry.type;
    if (existing && !(type === "Directory" && existing.isDirectory())) {
      dirs.forget(rel);
      rmSync(full, { recursive: true, force: true });
    }
    const mode = (entry.mode ?? 0o644) & 0o7777;
    switch (type) {
      case "Directory":
        if (!existing?.isDirectory()) mkdirSync(full, { mode: 0o755 });
        chmodSync(full, mode);
        dirs.add(rel);
        if (entry.mtime) dirTimes.push({ p: full, mtime: entry.mtime });
        break;
      case "File":
      case "OldFile":
      case "ContiguousFile": {
        // O_EXCL never follows a symlink at the last component; the parents were checked above.
        const fd = openSync(full, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
        try {
          for await (const chunk of entry as AsyncIterable<Buffer>) writeSync(fd, chunk);
          fchownSync(fd, entry.uid ?? 0, entry.gid ?? 0);
          fchmodSync(fd, mode); // after chown, which clears setuid bits
          if (entry.mtime) futimesSync(fd, entry.mtime, entry.mtime);
        } finally {
          closeSync(fd);
        }
        return;
      }
      case "SymbolicLink":
        if (!entry.linkpath) throw refuse(layer, `symbolic link ${rel} has no target`);
        symlinkSync(entry.linkpath, full);
        break;
      case "Link": {
        const to = memberPath(layer, entry.linkpath ?? "");
        if (to === "") throw refuse(layer, `hard link ${rel} points at the layer root`);
        dirs.ensure(path.posix.dirname(to) === "." ? "" : path.posix.dirname(to));
        const st = lstatOrUndefined(path.join(target, to));
        if (!st || st.isDirectory()) throw refuse(layer, `hard link ${rel} points at ${to}, which is not an earlier file of the layer`);
        linkSync(path.join(target, to), full);
        return; // shares the target's inode: owner and times are the target's
      }
      case "CharacterDevice":
      case "BlockDevice":
      case "FIFO":
        throw refuse(layer, `${rel} is a device node or FIFO (${type}); images may not carry them`);
      default:
        return; // extended headers and the like carry no file
    }
    lchownSync(full, entry.uid ?? 0, entry.gid ?? 0);
    if (type === "Directory") chmodSync(full, mode); // chown cleared setgid
    else if (entry.mtime) lutimesSync(full, entry.mtime, entry.mtime);
  };

  let failed!: (err: Error) => void;
  const failedPromise = new Promise<never>((_, reject) => (failed = reject));
  failedPromise.catch(() => undefined);
  const fail = (err: Error) => {
    if (failure) return;
    failure = err;
    failed(err);
  };
  const parser = new Parser({
    strict: true,
    onReadEntry: (entry: ReadEntry) => {
      if (failure) return entry.resume();
      queue++;
      chain = chain
        .then(() => (failure ? undefined : handle(entry)))
        .catch((err: unknown) => fail(err instanceof Error ? err : new Error(String(err))))
        .finally(() => {
          queue--;
          entry.resume(); // whatever was not read (a refused entry) must not hold the parser
        });
    },
  });
  parser.on("error", (err: Error) => fail(refuse(layer, `not a valid tar archive: ${err.message}`)));
  const parsed = new Promise<void>((resolve) => parser.on("end", resolve));

  const blobHash = createHash("sha256");
  const diffHash = createHash("sha256");
  const overCap = () => errors.resourceExhausted(`image is too large: more than ${input.budget.bytes} bytes uncompressed (a layer bomb?); layer ${layer}`);
  const diffTap = new Tap(diffHash, { limit: input.budget.bytes, onOver: overCap });
  try {
    await pipeline(createReadStream(input.blob), new Tap(blobHash), decompressor(input.mediaType), diffTap, async (source: AsyncIterable<Buffer>) => {
      for await (const chunk of source) {
        if (failure) throw failure;
        if (!parser.write(chunk)) await Promise.race([new Promise((r) => parser.once("drain", r)), failedPromise]);
        while (queue > 64 && !failure) await Promise.race([chain, failedPromise]);
      }
      parser.end();
      await Promise.race([parsed, failedPromise]);
      await chain;
    });
  } catch (err) {
    if (failure) throw failure;
    if (err instanceof ConnectError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    const e = err as Error;
    if (typeof code === "string" && (code.startsWith("Z_") || code.startsWith("ERR_ZSTD"))) throw refuse(layer, `the compressed stream is corrupt: ${e.message}`);
    throw err;
  }
  await chain;
  if (failure) throw failure;
  const gotBlob = `sha256:${blobHash.digest("hex")}`;
  if (gotBlob !== blobDigest) throw errors.failedPrecondition(`layer ${blobDigest} failed digest verification: its content hashes to ${gotBlob}`);
  const gotDiff = `sha256:${diffHash.digest("hex")}`;
  if (gotDiff !== input.diffId) throw errors.failedPrecondition(`layer ${blobDigest} failed digest verification: uncompressed it hashes to ${gotDiff}, the image config says ${input.diffId}`);

  // overlayfs form. Checked afresh: a later member may have replaced a directory that an earlier
  // marker or directory time was recorded under (with a symlink, say), and mknod, setfattr and
  // utimes resolve parents. Nothing writes the tree any more, so the checks hold.
  const final = new SafeDirs(layer, target);
  const parentOf = (rel: string) => (path.posix.dirname(rel) === "." ? "" : path.posix.dirname(rel));
  const marks: string[] = [];
  for (const w of whiteouts) {
    if (!final.isRealDir(parentOf(w))) throw refuse(layer, `the whiteout for ${w} lies below something that is no longer a directory`);
    // A whiteout the layer itself also fills is not a whiteout for it.
    if (lstatOrUndefined(path.join(target, w)) === undefined) marks.push(path.join(target, w));
  }
  for (const d of opaque) {
    if (!final.isRealDir(d)) throw refuse(layer, `the opaque marker of ${d} lies in something that is no longer a directory`);
  }
  await batch("/bin/sh", ["-c", 'for p do mknod "$p" c 0 0 || exit 1; done', "sh"], marks);
  await batch("setfattr", ["-h", "-n", "trusted.overlay.opaque", "-v", "y"], [...opaque].map((d) => path.join(target, d)));
  for (const { p, mtime } of dirTimes.reverse()) {
    if (final.isRealDir(path.relative(target, p))) await lutimes(p, mtime, mtime);
  }
  return { diffId: gotDiff, blobDigest: gotBlob, bytes: diffTap.total, files, whiteouts: [...whiteouts].sort(), opaque: [...opaque].sort() };
}

/** Runs `cmd ...args ...paths` in groups small enough for argv. */
async function batch(cmd: string, args: string[], paths: string[]): Promise<void> {
  for (let i = 0; i < paths.length; i += 500) {
    const group = paths.slice(i, i + 500);
    await new Promise<void>((resolve, reject) => {
      const child = spawn(cmd, [...args, ...group], { stdio: ["ignore", "ignore", "pipe"] });
      let stderr = "";
      child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
      child.on("error", (err) => reject(errors.failedPrecondition(`cannot run ${cmd} (Debian packages coreutils and attr): ${err.message}`)));
      child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} failed: ${stderr.trim()}`))));
    });
  }
}
