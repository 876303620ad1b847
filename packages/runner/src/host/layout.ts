import { createHash } from "node:crypto";
import path from "node:path";

// Where a sandbox lives on the host.
//
// Persistent, in the data dir (root only, 0700):  sandboxes/<id>/{sandbox.json, upper/, work/,
//   disk.img, disk/ (loop mount holding upper/ and work/ when a disk cap is set), init.log}
// Runtime, in the runtime dir (0711, traversable): <id>/root (the overlay mount) and <id>/run (the
//   agent's socket directory, bound to /run/sandbar inside).
//
// The runtime part is separate because bubblewrap 0.8 resolves its bind sources with realpath()
// as the unprivileged sandbox uid: they must be reachable by that uid, which a data dir under
// /root is not. /run is also the right home for mount points and sockets: both die with a reboot.

export class Layout {
  readonly dataDir: string;
  readonly runtimeDir: string;
  /** Stable short name of this data dir: separates runners sharing a host (cgroups, runtime dir). */
  readonly key: string;

  constructor(dataDir: string, runtimeDir?: string) {
    this.dataDir = path.resolve(dataDir);
    this.key = createHash("sha256").update(this.dataDir).digest("hex").slice(0, 12);
    this.runtimeDir = runtimeDir ? path.resolve(runtimeDir) : path.join("/run/sandbar", this.key);
  }

  get sandboxesDir(): string {
    return path.join(this.dataDir, "sandboxes");
  }
  get snapshotsDir(): string {
    return path.join(this.dataDir, "snapshots");
  }
  sandboxDir(id: string): string {
    return path.join(this.sandboxesDir, id);
  }
  stateFile(id: string): string {
    return path.join(this.sandboxDir(id), "sandbox.json");
  }
  initLog(id: string): string {
    return path.join(this.sandboxDir(id), "init.log");
  }
  diskImage(id: string): string {
    return path.join(this.sandboxDir(id), "disk.img");
  }
  diskMount(id: string): string {
    return path.join(this.sandboxDir(id), "disk");
  }
  /** Directory holding upper/ and work/: the sandbox dir, or the mounted disk image. */
  layerDir(id: string, hasDisk: boolean): string {
    return hasDisk ? this.diskMount(id) : this.sandboxDir(id);
  }
  upper(id: string, hasDisk: boolean): string {
    return path.join(this.layerDir(id, hasDisk), "upper");
  }
  work(id: string, hasDisk: boolean): string {
    return path.join(this.layerDir(id, hasDisk), "work");
  }
  runtime(id: string): string {
    return path.join(this.runtimeDir, id);
  }
  rootMount(id: string): string {
    return path.join(this.runtime(id), "root");
  }
  runDir(id: string): string {
    return path.join(this.runtime(id), "run");
  }
  socket(id: string): string {
    return path.join(this.runDir(id), "agent.sock");
  }
}
