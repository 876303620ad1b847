import { mkdir, rm } from "node:fs/promises";
import path from "node:path";

// Where volume data lives. One implementation today: this host's disk. A runner on another host
// (or many) would implement the same with shared storage (see docs/volumes.md on S3-backed volumes).

export interface VolumeStorage {
  /** Makes the volume's (empty) storage; idempotent. */
  create(id: string): Promise<void>;
  /** Removes the volume's storage and everything in it; unknown ids are fine. */
  remove(id: string): Promise<void>;
  /** The directory a sandbox on this host mounts for the volume. */
  hostPath(id: string): string;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Volumes as directories `<dir>/<id>` (the runner sets their group and mode when it mounts them). */
export class HostDiskVolumes implements VolumeStorage {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = path.resolve(dir);
  }

  async create(id: string): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    await mkdir(this.hostPath(id), { recursive: true, mode: 0o700 });
  }

  async remove(id: string): Promise<void> {
    await rm(this.hostPath(id), { recursive: true, force: true });
  }

  hostPath(id: string): string {
    // Ids come from our own rows; the check keeps a bad one from naming anything else.
    if (!UUID.test(id)) throw new Error(`not a volume id: ${id}`);
    return path.join(this.dir, id);
  }
}
