import { mkdir } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { errors } from "@sandbar/protocol";
import { packLayer, restoreLayer } from "../host/layer.ts";
import { isMountpoint, unmount } from "../host/mounts.ts";
import type { SandboxRecord } from "../host/record.ts";
import type { SandboxHost } from "../host/sandbox-host.ts";
import { type ChangeSource, PLATFORM_PATHS, platformUser } from "../provider.ts";
import type { CgroupBackend } from "./cgroups/types.ts";
import { mountDiskImage } from "./mounts.ts";

// A linux sandbox's writable layer as a tar stream and back (host/layer.ts's format): the upper
// directory, on its disk image when it has a cap (mounted for the while when not running).

/** The layer as a tar stream; the sandbox's lock (and a temporary mount) are held until tar is done. */
export async function packSandbox(host: SandboxHost, id: string): Promise<Readable> {
  const release = await host.lock.acquire(id);
  let mountedHere = false;
  const L = host.layout;
  try {
    const rec = await host.record(id);
    const hasDisk = rec.spec.diskGiB !== undefined;
    if (hasDisk && !(await isMountpoint(L.diskMount(id)))) {
      await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
      await mountDiskImage(L.diskImage(id), L.diskMount(id), true);
      mountedHere = true;
    }
    // The lock (and a temporary mount) are held until tar is done with the layer.
    const cleanup = async () => {
      if (mountedHere) await unmount(L.diskMount(id)).catch((e: unknown) => host.log(`sandbox ${id}: unmount after pack: ${String(e)}`));
      release();
    };
    const handle = await packLayer(L.upper(id, hasDisk), rec.hostUid, path.join(L.sandboxDir(id), "owner-map"), cleanup);
    return handle.stream;
  } catch (err) {
    if (mountedHere) await unmount(L.diskMount(id)).catch(() => undefined);
    release();
    throw err;
  }
}

/** Replaces the layer of a sandbox that is not running (call under its lock, after its teardown). */
export async function restoreSandbox(host: SandboxHost, rec: SandboxRecord, archive: Readable): Promise<void> {
  const id = rec.spec.id;
  const L = host.layout;
  const hasDisk = rec.spec.diskGiB !== undefined;
  if (hasDisk) {
    await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
    await mountDiskImage(L.diskImage(id), L.diskMount(id));
  }
  try {
    await restoreLayer(L.upper(id, hasDisk), L.work(id, hasDisk), archive, rec.hostUid);
  } catch (err) {
    throw errors.failedPrecondition(`sandbox ${id}: ${(err as Error).message}`);
  } finally {
    if (hasDisk) await unmount(L.diskMount(id));
  }
}

/** How sandboxChangeLayers reads: frozen or not, against a checkpoint, where captured layers are. */
interface ChangeRead {
  consistent: boolean;
  /** A checkpoint's captured layers (top first), on the sandbox's image. */
  since?: string[];
  /** A captured layer's root (rejects one not on this host). */
  layerRoot(layerId: string): Promise<string>;
}

/**
 * The layers a changeset reads (provider.changeLayers): the upper over the sandbox's captured
 * layers and its snapshot's root; with `since`, compared with the checkpoint's layers on that
 * root. A stopped sandbox with a disk cap has its image mounted read-only, under its lock, until
 * release; a running one is frozen for the while when `consistent` (unless already frozen: a
 * paused one).
 */
export async function sandboxChangeLayers(host: SandboxHost, cgroups: CgroupBackend, id: string, read: ChangeRead): Promise<ChangeSource> {
  const { consistent } = read;
  const L = host.layout;
  const rec = await host.record(id);
  const own = await Promise.all((rec.spec.layers ?? []).map((l) => read.layerRoot(l)));
  const since = read.since?.length ? [...(await Promise.all(read.since.map((l) => read.layerRoot(l)))), rec.spec.rootfs] : undefined;
  const hasDisk = rec.spec.diskGiB !== undefined;
  let unlock: (() => void) | undefined;
  let mountedHere = false;
  let frozeHere = false;
  const release = async () => {
    if (frozeHere) await cgroups.thaw(id).catch((e: unknown) => host.log(`sandbox ${id}: thaw after a changeset: ${String(e)}`));
    frozeHere = false;
    if (mountedHere) await unmount(L.diskMount(id)).catch((e: unknown) => host.log(`sandbox ${id}: unmount after a changeset: ${String(e)}`));
    mountedHere = false;
    unlock?.();
    unlock = undefined;
  };
  try {
    if (hasDisk && !(await isMountpoint(L.diskMount(id)))) {
      unlock = await host.lock.acquire(id);
      if (!(await isMountpoint(L.diskMount(id)))) {
        await mkdir(L.diskMount(id), { recursive: true, mode: 0o700 });
        await mountDiskImage(L.diskImage(id), L.diskMount(id), true);
        mountedHere = true;
      }
    }
    if (consistent && (await cgroups.pids(id)).length > 0 && !(await cgroups.frozen(id))) {
      await cgroups.freeze(id);
      frozeHere = true;
    }
  } catch (err) {
    await release();
    throw err;
  }
  // Mount points of binds and volumes are the platform's; what is behind them is not in the upper.
  const exclude = [...PLATFORM_PATHS, ...(rec.spec.mounts ?? []).map((m) => m.target), ...(rec.spec.volumes ?? []).map((v) => v.target)];
  return { layers: { upper: L.upper(id, hasDisk), lowers: [...own, rec.spec.rootfs], since, exclude, platformUser: platformUser(rec.spec.user) }, release };
}
