import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

// Packs of sandboxes' writable layers on the control host: archives (the only copy of an
// archived sandbox's files) and backups (a point-in-time copy, used when the host lost a layer).
// Written as <file>.partial and renamed when complete, so a file that exists is whole.

export class LayerFiles {
  readonly archivesDir: string;
  readonly backupsDir: string;

  constructor(dataDir: string) {
    this.archivesDir = path.join(dataDir, "archives");
    this.backupsDir = path.join(dataDir, "backups");
  }

  archive(id: string): string {
    return path.join(this.archivesDir, `${id}.tar`);
  }

  backup(id: string): string {
    return path.join(this.backupsDir, `${id}.tar`);
  }

  /** Streams a pack to `file` (never held in memory), synced to disk before it takes the name. */
  async write(pack: Readable, file: string): Promise<void> {
    await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const partial = `${file}.partial`;
    try {
      await pipeline(pack, createWriteStream(partial, { mode: 0o600 }));
      const fh = await open(partial, "r");
      try {
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(partial, file);
    } catch (err) {
      pack.destroy();
      await rm(partial, { force: true });
      throw err;
    }
  }

  read(file: string): Readable {
    return createReadStream(file);
  }

  async exists(file: string): Promise<boolean> {
    return stat(file).then((s) => s.isFile(), () => false);
  }

  async removeArchive(id: string): Promise<void> {
    await rm(this.archive(id), { force: true });
  }

  async remove(id: string): Promise<void> {
    await rm(this.archive(id), { force: true });
    await rm(this.backup(id), { force: true });
  }

  /** Drops what a crash left half-written. */
  async removePartials(): Promise<void> {
    for (const dir of [this.archivesDir, this.backupsDir]) {
      for (const f of await readdir(dir).catch(() => [] as string[])) {
        if (f.endsWith(".partial")) await rm(path.join(dir, f), { force: true });
      }
    }
  }
}
