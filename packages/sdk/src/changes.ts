import { createWriteStream } from "node:fs";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { SandboxChange, SandboxChangeList, SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";

/** What a changeset read takes: a path prefix, a frozen read, and (later) a checkpoint to compare with. */
export interface ChangesOptions extends CallOptions {
  /** Only paths at or below this absolute path. */
  pathPrefix?: string;
  /** Freeze the sandbox while its changes are read (thawed after). */
  consistent?: boolean;
  /** Changes since a checkpoint: a snapshot (name or id) taken of this sandbox or an ancestor (`createSnapshot`). */
  since?: string;
}

/**
 * What a sandbox changed since its creation (docs/changesets.md): entries page by page, or the
 * changed files as a tar (deletions as `.wh.<name>` entries) or a unified diff, streamed.
 */
export class Changes {
  /** The generated SandboxChangesService client, for calls not wrapped here. */
  readonly client: Client<typeof SandboxChangesService>;
  readonly #sandboxId: string;

  constructor(client: Client<typeof SandboxChangesService>, sandboxId: string) {
    this.client = client;
    this.#sandboxId = sandboxId;
  }

  /** One page of entries (`nextCursor` is set when more follow). */
  list(o: ChangesOptions & { cursor?: string; limit?: number } = {}): Promise<SandboxChangeList> {
    const { pathPrefix, consistent, since, cursor, limit, ...opts } = o;
    return this.client.listSandboxChanges({ sandboxId: this.#sandboxId, pathPrefix, consistent, since, cursor, limit }, opts);
  }

  /** Every entry, read page by page. */
  async *all(o: ChangesOptions & { pageSize?: number } = {}): AsyncGenerator<SandboxChange> {
    const { pageSize, ...rest } = o;
    let cursor: string | undefined;
    do {
      const page = await this.list({ ...rest, cursor, limit: pageSize });
      yield* page.items;
      cursor = page.nextCursor;
    } while (cursor);
  }

  /** The changed files as a tar, as its bytes arrive. */
  tar(o: ChangesOptions = {}): AsyncGenerator<Uint8Array> {
    return this.#export("tar", o);
  }

  /** A unified diff of the changed text files, as its bytes arrive. */
  diff(o: ChangesOptions = {}): AsyncGenerator<Uint8Array> {
    return this.#export("diff", o);
  }

  /** The diff as one string. */
  async diffText(o: ChangesOptions = {}): Promise<string> {
    const parts: Buffer[] = [];
    for await (const chunk of this.diff(o)) parts.push(Buffer.from(chunk));
    return Buffer.concat(parts).toString("utf8");
  }

  /** Writes the tar to a local file as it arrives. */
  async downloadTar(localPath: string, o: ChangesOptions = {}): Promise<void> {
    await pipeline(Readable.from(this.tar(o)), createWriteStream(localPath));
  }

  async *#export(format: "tar" | "diff", o: ChangesOptions): AsyncGenerator<Uint8Array> {
    const { pathPrefix, consistent, since, ...opts } = o;
    for await (const chunk of this.client.exportSandboxChanges({ sandboxId: this.#sandboxId, format, pathPrefix, consistent, since }, opts)) yield chunk.data;
  }
}
