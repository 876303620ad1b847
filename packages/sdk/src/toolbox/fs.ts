import { createReadStream, createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { FileInfo, FileService, UploadedFile } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { SandbarError } from "../errors.ts";
import { chunksOf, CHUNK_BYTES, type UploadSource } from "./chunks.ts";

/** Files of one sandbox. Paths are the sandbox's (relative ones start at the sandbox user's home). */
export class FileSystem {
  /** The generated FileService client for this sandbox, for the calls not wrapped here (find, search, replace, permissions, multi-file). */
  readonly client: Client<typeof FileService>;

  constructor(client: Client<typeof FileService>) {
    this.client = client;
  }

  /** Writes `source` to `path` in the sandbox, streamed in 1 MiB messages; answers the bytes stored. */
  async upload(path: string, source: UploadSource, opts?: CallOptions): Promise<UploadedFile> {
    async function* parts() {
      yield { part: { case: "header" as const, value: { path } } };
      for await (const chunk of chunksOf(source)) yield { part: { case: "data" as const, value: chunk } };
    }
    const res = await this.client.uploadFile(parts(), opts);
    if (!res.file) throw new SandbarError("upload answered no file", "internal", 500);
    return res.file;
  }

  /** Uploads the local file `localPath` to `path`, read as it is sent. */
  uploadFile(localPath: string, path: string, opts?: CallOptions): Promise<UploadedFile> {
    return this.upload(path, createReadStream(localPath, { highWaterMark: CHUNK_BYTES }), opts);
  }

  /** The file's bytes as they arrive (its FileInfo first, through `onInfo`). */
  async *download(path: string, opts?: CallOptions & { onInfo?: (info: FileInfo) => void }): AsyncGenerator<Uint8Array> {
    for await (const m of this.client.downloadFile({ path }, opts)) {
      if (m.part.case === "data") yield m.part.value;
      else if (m.part.case === "info") opts?.onInfo?.(m.part.value);
    }
  }

  /** Downloads `path` into the local file `localPath`, written as it arrives; answers the bytes written. */
  async downloadFile(path: string, localPath: string, opts?: CallOptions): Promise<number> {
    let bytes = 0;
    const counted = async function* (src: AsyncIterable<Uint8Array>) {
      for await (const c of src) {
        bytes += c.length;
        yield c;
      }
    };
    try {
      await pipeline(Readable.from(counted(this.download(path, opts))), createWriteStream(localPath));
    } catch (err) {
      // No half-written file left behind under the name the caller asked for.
      await rm(localPath, { force: true });
      throw err;
    }
    return bytes;
  }

  /** A small file whole, in memory (use download() for large ones). */
  async readFile(path: string, opts?: CallOptions): Promise<Buffer> {
    const parts: Uint8Array[] = [];
    for await (const c of this.download(path, opts)) parts.push(c);
    return Buffer.concat(parts);
  }

  async list(path: string, opts?: CallOptions): Promise<FileInfo[]> {
    return (await this.client.listFiles({ path }, opts)).items;
  }

  stat(path: string, opts?: CallOptions): Promise<FileInfo> {
    return this.client.getFileInfo({ path }, opts);
  }

  /** Creates the folder and its parents; `mode` as octal text ("755"). */
  async mkdir(path: string, mode = "755", opts?: CallOptions): Promise<void> {
    await this.client.createFolder({ path, mode }, opts);
  }

  async delete(path: string, o: { recursive?: boolean } & CallOptions = {}): Promise<void> {
    const { recursive = false, ...opts } = o;
    await this.client.deleteFile({ path, recursive }, opts);
  }

  async move(source: string, destination: string, opts?: CallOptions): Promise<void> {
    await this.client.moveFile({ source, destination }, opts);
  }
}
