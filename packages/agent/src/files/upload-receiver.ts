import { errors } from "@sandbar/protocol";
import { UploadTarget } from "./transfer.ts";

/**
 * A caller that sends this request header (control does) ends a complete upload with an empty
 * message: an upload whose stream ends without one was cancelled, whatever the stream says (a
 * Node client that cancels a call sends its end of stream before the reset).
 */
export const UPLOAD_SEALED_HEADER = "x-sandbar-upload-sealed";

/** A file an upload wrote: the destination as the caller gave it, and its size. */
export interface Uploaded {
  path: string;
  bytes: bigint;
}

/**
 * What an upload's messages do, in order, whichever decoder read them (Connect's,
 * or the direct gRPC one in grpc-wire/upload.ts): a header opens the next file, data
 * goes to the open file, the end closes it. `many` is UploadFiles (any number of
 * files, each started by a header); otherwise UploadFile (exactly one header,
 * first). A failed upload closes its file without claiming it: the caller
 * answers with the error.
 */
export class UploadReceiver {
  private target: UploadTarget | undefined;
  private readonly files: Uploaded[] = [];
  private readonly resolve: (p: string) => string;
  private readonly many: boolean;

  constructor(resolve: (p: string) => string, many: boolean) {
    this.resolve = resolve;
    this.many = many;
  }

  async header(given: string): Promise<void> {
    if (!this.many) {
      if (this.target) throw errors.invalidArgument("an upload carries one header; use UploadFiles for several files");
      this.target = await UploadTarget.create(this.resolve(given), given);
      return;
    }
    if (this.target) {
      const done = this.target;
      this.target = undefined;
      await done.close();
      this.files.push({ path: done.shownPath, bytes: done.bytes });
    }
    const dest = given.trim();
    this.target = await UploadTarget.create(this.resolve(dest), dest);
  }

  /** The pieces of one data message (or of a part of one), in order. */
  async data(pieces: readonly Uint8Array[]): Promise<void> {
    if (!this.target) {
      throw errors.invalidArgument(this.many ? "file data came before a header naming its path" : "the first message of an upload must be its header");
    }
    await this.target.write(pieces);
  }

  /** The upload's end: the last file closed (its errors surface here); the files written. */
  async finish(): Promise<Uploaded[]> {
    if (!this.many && !this.target) throw errors.invalidArgument("the upload had no header naming its path");
    if (this.target) {
      const done = this.target;
      this.target = undefined;
      await done.close();
      this.files.push({ path: done.shownPath, bytes: done.bytes });
    }
    return this.files;
  }

  /** Closes the open file without reporting: the upload failed. */
  async abandon(): Promise<void> {
    const t = this.target;
    this.target = undefined;
    await t?.abandon();
  }
}
