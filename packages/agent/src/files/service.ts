import { chmod, chown, cp, lstat, mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import * as path from "node:path";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import type { AgentContext } from "../context.ts";
import { fsCall, fsError } from "../util/fs-errors.ts";
import { resolvePath } from "../util/paths.ts";
import { fileInfo } from "./file-info.ts";
import { findInFiles } from "./find.ts";
import { compileGlob } from "./glob.ts";
import { lookupGid, lookupUid, parseMode } from "./owners.ts";
import { replaceInFile } from "./replace.ts";
import { searchFiles } from "./search.ts";
import { openForDownload, readChunks } from "./transfer.ts";
import { UPLOAD_SEALED_HEADER, UploadReceiver, type Uploaded } from "./upload-receiver.ts";

const DEFAULT_LIMIT = 10_000;
const MAX_LIMIT = 100_000;

function limitOf(requested: number): number {
  if (requested === 0) return DEFAULT_LIMIT;
  return Math.min(requested, MAX_LIMIT);
}

/** The reference's error code and HTTP status for a path that cannot be downloaded. */
function downloadError(err: unknown, p: string): { code: string; statusCode: number; message: string } {
  const e = fsError(err, p);
  const message = e.rawMessage;
  switch (e.code) {
    case 5: // NotFound
      return { code: "FILE_NOT_FOUND", statusCode: 404, message };
    case 7: // PermissionDenied
      return { code: "FILE_ACCESS_DENIED", statusCode: 403, message };
    case 3: // InvalidArgument
      return { code: "INVALID_FILE_PATH", statusCode: 400, message };
    default:
      return { code: "FILE_READ_FAILED", statusCode: 500, message };
  }
}

export function createFileService(ctx: AgentContext): ServiceImpl<typeof FileService> {
  const resolve = (p: string, what?: string) => resolvePath(ctx.workDir, p, what);

  return {
    async listFiles(req) {
      const dir = resolvePath(ctx.workDir, req.path, "path", ".");
      const names = await fsCall(dir, () => readdir(dir));
      const stats = await Promise.all(
        names.map(async (name) => {
          const p = path.join(dir, name);
          try {
            return fileInfo(p, await stat(p, { bigint: true }));
          } catch {
            return undefined; // Broken links and entries removed meanwhile.
          }
        }),
      );
      return { items: stats.filter((s) => s !== undefined) };
    },

    async getFileInfo(req) {
      const p = resolve(req.path);
      return fileInfo(p, await fsCall(p, () => stat(p, { bigint: true })));
    },

    async deleteFile(req) {
      const p = resolve(req.path);
      const st = await fsCall(p, () => lstat(p));
      if (st.isDirectory() && !req.recursive) {
        throw errors.invalidArgument(`${p} is a directory: set recursive to delete it`); // the reference: 400
      }
      await fsCall(p, () => rm(p, { recursive: req.recursive, force: false }));
      return {};
    },

    async createFolder(req) {
      const p = resolve(req.path);
      const mode = req.mode === "" ? 0o755 : parseMode(req.mode);
      if (mode === undefined) throw errors.invalidArgument(`invalid mode format: ${JSON.stringify(req.mode)} (octal, e.g. "755")`);
      const created = await fsCall(p, () => mkdir(p, { recursive: true, mode }));
      // mkdir's mode passes through the umask; the caller asked for this exact mode.
      if (created !== undefined) await fsCall(p, () => chmod(p, mode));
      else if (!(await fsCall(p, () => stat(p))).isDirectory()) throw errors.alreadyExists(`${p} exists and is not a directory`);
      return {};
    },

    async moveFile(req) {
      const src = resolve(req.source, "source");
      const dst = resolve(req.destination, "destination");
      await fsCall(src, () => lstat(src));
      await fsCall(path.dirname(dst), () => stat(path.dirname(dst)));
      try {
        await lstat(dst);
        throw errors.alreadyExists(`destination already exists: ${dst}`);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw fsError(err, dst);
      }
      try {
        await rename(src, dst);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EXDEV") throw fsError(err, src);
        // Another file system: copy, then remove the source.
        await fsCall(dst, () => cp(src, dst, { recursive: true, preserveTimestamps: true, errorOnExist: true, force: false }));
        await fsCall(src, () => rm(src, { recursive: true, force: true }));
      }
      return {};
    },

    async setFilePermissions(req) {
      const p = resolve(req.path);
      let mode: number | undefined;
      if (req.mode !== "") {
        mode = parseMode(req.mode);
        if (mode === undefined) throw errors.invalidArgument(`invalid mode format: ${JSON.stringify(req.mode)} (octal, e.g. "644")`);
      }
      let uid = -1;
      let gid = -1;
      if (req.owner !== "") {
        const id = await lookupUid(req.owner);
        if (id === undefined) throw errors.invalidArgument(`user not found: ${req.owner}`);
        uid = id;
      }
      if (req.group !== "") {
        const id = await lookupGid(req.group);
        if (id === undefined) throw errors.invalidArgument(`group not found: ${req.group}`);
        gid = id;
      }
      await fsCall(p, () => stat(p));
      if (mode !== undefined) await fsCall(p, () => chmod(p, mode));
      if (uid !== -1 || gid !== -1) await fsCall(p, () => chown(p, uid, gid));
      return {};
    },

    async findInFiles(req, call) {
      const root = resolve(req.path);
      if (req.pattern === "") throw errors.invalidArgument("pattern is required");
      return findInFiles(root, req.path, req.pattern, limitOf(req.limit), call.signal);
    },

    async searchFiles(req, call) {
      const root = resolve(req.path);
      if (req.pattern === "") throw errors.invalidArgument("pattern is required");
      const glob = compileGlob(req.pattern);
      if (typeof glob === "string") throw errors.invalidArgument(`invalid pattern ${JSON.stringify(req.pattern)}: ${glob}`);
      return searchFiles(root, req.path, glob, limitOf(req.limit), call.signal);
    },

    async replaceInFiles(req) {
      if (req.pattern === "") throw errors.invalidArgument("pattern is required");
      const results = [];
      for (const f of req.files) {
        try {
          const p = resolve(f, "file");
          await replaceInFile(p, req.pattern, req.newValue, ctx.stateDir);
          results.push({ file: f, success: true });
        } catch (err) {
          results.push({ file: f, success: false, error: fsError(err, f).rawMessage });
        }
      }
      return { results };
    },

    async *downloadFile(req, call) {
      const p = resolve(req.path);
      const { fh } = await openForDownload(p);
      try {
        const st = await fh.stat({ bigint: true });
        yield { part: { case: "info", value: fileInfo(p, st) } };
        for await (const data of readChunks(fh, call.signal)) yield { part: { case: "data", value: data } };
      } finally {
        await fh.close();
      }
    },

    async *downloadFiles(req, call) {
      if (req.paths.length === 0) throw errors.invalidArgument("paths must name at least one file");
      for (const requested of req.paths) {
        let opened;
        try {
          if (requested === "") throw errors.invalidArgument("empty path");
          opened = await openForDownload(resolve(requested));
        } catch (err) {
          yield { part: { case: "error", value: { path: requested, ...downloadError(err, requested) } } };
          continue;
        }
        try {
          yield { part: { case: "file", value: { path: requested, size: opened.size } } };
          for await (const data of readChunks(opened.fh, call.signal)) yield { part: { case: "data", value: data } };
        } finally {
          await opened.fh.close();
        }
      }
    },

    async uploadFile(requests, call) {
      const [file] = await receiveUpload(requests, new UploadReceiver(resolve, false), call.requestHeader.has(UPLOAD_SEALED_HEADER));
      return { file };
    },

    async uploadFiles(requests, call) {
      return { files: await receiveUpload(requests, new UploadReceiver(resolve, true), call.requestHeader.has(UPLOAD_SEALED_HEADER)) };
    },
  };
}

/**
 * Feeds an upload's decoded messages to its receiver; a failure abandons the open file. `sealing`:
 * the caller ends a complete upload with an empty message (see UPLOAD_SEALED_HEADER).
 */
async function receiveUpload(
  requests: AsyncIterable<{ part: { case: "header"; value: { path: string } } | { case: "data"; value: Uint8Array } | { case: undefined; value?: undefined } }>,
  receiver: UploadReceiver,
  sealing = false,
): Promise<Uploaded[]> {
  try {
    let sealed = false;
    for await (const req of requests) {
      sealed = req.part.case === undefined;
      if (req.part.case === "header") await receiver.header(req.part.value.path);
      else if (req.part.case === "data") await receiver.data([req.part.value]);
    }
    if (sealing && !sealed) throw new ConnectError("the upload was cancelled", Code.Canceled);
    return await receiver.finish();
  } catch (err) {
    await receiver.abandon();
    throw err;
  }
}
