import { createReadStream, createWriteStream } from "node:fs";
import { rm, stat } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { FileInfo, FileService, UploadedFile } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { SandbarError } from "../errors.ts";
import { chunksOf, CHUNK_BYTES, type UploadSource } from "./chunks.ts";

/** Options of a transfer: the call's, and progress for a bar (`total` when known: bytes, text, a local file, any download). */
export interface TransferOptions extends CallOptions {
  onProgress?: (bytes: number, total: number | undefined) => void;
}

/** Files of one sandbox. Paths are the sandbox's (relative ones start at its work dir). */
export class FileSystem {
  /** The generated FileService client for this sandbox, for the calls not wrapped here (find, search, replace, permissions, multi-file). */
  readonly client: Client<typeof FileService>;

  constructor(client: Client<typeof FileService>) {
    this.client = client;
  }

  /** Writes `source` to `path` in the sandbox, streamed in 1 MiB messages; answers the bytes stored. */
  async upload(path: string, source: UploadSource, o: TransferOptions & { total?: number } = {}): Promise<UploadedFile> {
    const { onProgress, total: given, ...opts } = o;
    const total = given ?? (typeof source === "string" ? Buffer.byteLength(source) : source instanceof Uint8Array ? source.length : undefined);
    async function* parts() {
      yield { part: { case: "header" as const, value: { path } } };
      let sent = 0;
      for await (const chunk of chunksOf(source)) {
        yield { part: { case: "data" as const, value: chunk } };
        sent += chunk.length;
        onProgress?.(sent, total);
      }
    }
    const res = await this.client.uploadFile(parts(), opts);
    if (!res.file) throw new SandbarError("upload answered no file", "internal", 500);
    return res.file;
  }

  /** Uploads the local file `localPath` to `path`, read as it is sent. */
  async uploadFile(localPath: string, path: string, opts: TransferOptions = {}): Promise<UploadedFile> {
    const { size } = await stat(localPath);
    return this.upload(path, createReadStream(localPath, { highWaterMark: CHUNK_BYTES }), { ...opts, total: size });
  }

  /** The file's bytes as they arrive (its FileInfo first, through `onInfo`). */
  async *download(path: string, o: TransferOptions & { onInfo?: (info: FileInfo) => void } = {}): AsyncGenerator<Uint8Array> {
    const { onInfo, onProgress, ...opts } = o;
    let total: number | undefined;
    let received = 0;
    for await (const m of this.client.downloadFile({ path }, opts)) {
      if (m.part.case === "data") {
        received += m.part.value.length;
        onProgress?.(received, total);
        yield m.part.value;
      } else if (m.part.case === "info") {
        total = Number(m.part.value.size);
        onInfo?.(m.part.value);
      }
    }
  }

  /** Downloads `path` into the local file `localPath`, written as it arrives; answers the bytes written. */
  async downloadFile(path: string, localPath: string, opts: TransferOptions = {}): Promise<number> {
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
