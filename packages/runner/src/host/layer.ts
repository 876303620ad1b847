import { spawn } from "node:child_process";
import { lchown, lstat, mkdir, opendir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { PassThrough, type Readable } from "node:stream";

// The writable layer as a tar stream, and back. GNU tar keeps what overlayfs needs: whiteouts
// (0/0 character devices) and opaque directories (the trusted.overlay.opaque xattr).
//
// Files owned by the sandbox's host uid are stored under a fixed archive uid and mapped to the
// receiving sandbox's host uid on restore, so an archive moves between sandboxes and runners.

/** Owner of sandbox files inside an archive (outside every host uid range we hand out). */
const ARCHIVE_UID = 2_000_000_000;

const XATTRS = ["--xattrs", "--xattrs-include=user.*", "--xattrs-include=trusted.overlay.opaque"];

export interface PackHandle {
  stream: Readable;
  /** Settles when tar has finished (rejects when it failed; the stream errors too). */
  done: Promise<void>;
}

/**
 * Streams `upper` as tar. `mapFile` is a scratch path for tar's owner map. `cleanup` runs when
 * tar is done and before the stream ends, so a reader that saw the end finds everything released.
 */
export async function packLayer(upper: string, hostUid: number, mapFile: string, cleanup: () => Promise<void> = async () => undefined): Promise<PackHandle> {
  await writeFile(mapFile, `+${hostUid} sandbox:${ARCHIVE_UID}\n`, { mode: 0o600 });
  const child = spawn(
    "tar",
    ["--create", "--file=-", "--directory", upper, "--numeric-owner", "--sparse", ...XATTRS,
      `--owner-map=${mapFile}`, `--group-map=${mapFile}`, "."],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  const out = new PassThrough();
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
  // Only a successful tar ends the stream; a failure must reach the reader as an error, never as EOF.
  child.stdout.pipe(out, { end: false });
  const done = new Promise<void>((resolve, reject) => {
    const settle = async (err: Error | undefined) => {
      await rm(mapFile, { force: true }).catch(() => undefined);
      await cleanup().catch(() => undefined);
      if (err) {
        out.destroy(err);
        reject(err);
      } else {
        out.end();
        resolve();
      }
    };
    let settled = false;
    const once = (err: Error | undefined) => {
      if (!settled) {
        settled = true;
        void settle(err);
      }
    };
    child.on("error", (err) => once(err));
    child.on("close", (code, signal) => {
      once(code === 0 ? undefined : new Error(`packing the writable layer failed (tar ${signal ?? code}): ${stderr.trim()}`));
    });
  });
  // A reader that goes away stops tar.
  out.on("close", () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  done.catch(() => undefined);
  return { stream: out, done };
}

/** Empties `upper` and `work`, then fills `upper` from a pack stream. */
export async function restoreLayer(upper: string, work: string, archive: Readable, hostUid: number): Promise<void> {
  if (archive.errored) throw new Error(`restoring the writable layer failed: the archive stream broke: ${archive.errored.message}`);
  if (archive.destroyed || archive.readableEnded) throw new Error("restoring the writable layer failed: the archive stream was already closed");
  await rm(upper, { recursive: true, force: true });
  await rm(work, { recursive: true, force: true });
  await mkdir(upper, { mode: 0o755 });
  await mkdir(work, { mode: 0o700 });
  const child = spawn(
    "tar",
    ["--extract", "--file=-", "--directory", upper, "--numeric-owner", "--same-owner", "--same-permissions", ...XATTRS],
    { stdio: ["pipe", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
  const exited = new Promise<{ code: number | null; signal: string | null; error?: Error }>((resolve) => {
    child.on("error", (error) => resolve({ code: null, signal: null, error }));
    child.on("close", (code, signal) => resolve({ code, signal }));
  });
  // Once tar is gone nothing reads its stdin: close it, or "close" would wait for a source that
  // never writes again.
  child.on("exit", () => child.stdin.destroy());
  // Not pipeline(): tar stops reading at the end-of-archive marker and may leave record padding
  // unread, which breaks the pipe, and pipeline would then report that as the source failing. Here
  // tar's exit status says whether the restore worked, and only the source's own errors count.
  let sourceError: Error | undefined;
  archive.on("error", (err: Error) => {
    sourceError ??= err;
    child.stdin.destroy(); // tar sees the end of its input
  });
  child.stdin.on("error", () => undefined); // EPIPE once tar has stopped reading
  archive.pipe(child.stdin);
  const tar = await exited;
  archive.unpipe(child.stdin);
  if (!archive.destroyed) archive.destroy();
  if (tar.code !== 0) {
    const why = stderr.trim() || tar.error?.message || sourceError?.message || `tar ${tar.signal ?? tar.code}`;
    throw new Error(`restoring the writable layer failed: ${why}`);
  }
  // A source that broke at a member boundary looks like a complete archive to tar.
  if (sourceError) throw new Error(`restoring the writable layer failed: the archive stream broke: ${sourceError.message}`);
  await remapOwner(upper, ARCHIVE_UID, hostUid);
}

/** lchown of every entry owned (uid or gid) by `from` to `to`; never follows symlinks. */
async function remapOwner(dir: string, from: number, to: number): Promise<void> {
  const fix = async (p: string) => {
    const st = await lstat(p);
    if (st.uid === from || st.gid === from) await lchown(p, st.uid === from ? to : st.uid, st.gid === from ? to : st.gid);
  };
  await fix(dir);
  const stack = [dir];
  while (stack.length > 0) {
    const d = stack.pop()!;
    for await (const e of await opendir(d)) {
      const p = path.join(d, e.name);
      await fix(p);
      if (e.isDirectory()) stack.push(p);
    }
  }
}
