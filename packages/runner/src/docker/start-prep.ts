import { chown, mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { SandboxSpec } from "../provider.ts";
import type { SandboxRecord } from "../host/record.ts";
import { type SandboxHost, sandboxEnv } from "../host/sandbox-host.ts";
import { bindVolume, prepareVolumeRoot } from "../host/volume-binds.ts";
import type { ContainerState } from "./containers.ts";
import { envFile, prepareUser, type SandboxUser } from "./user-prep.ts";

// What the host prepares before the engine starts a sandbox's container: the files its binds
// point at (runtime dir, env, secret, resolv.conf, volumes) and the user in its writable layer.

/** No user namespace: the sandbox's uid is its host uid inside too (root stays uid 0, without capabilities). */
export function userOf(spec: SandboxSpec, hostUid: number): SandboxUser {
  return spec.user === "root" ? { name: "root", uid: 0, gid: 0, home: "/root" } : { name: spec.user!, uid: hostUid, gid: hostUid, home: `/home/${spec.user}` };
}

/** The host side of a start: runtime dir, env and secret files, resolv.conf, volume binds, the user in the layer. */
export async function prepareStart(host: SandboxHost, rec: SandboxRecord, state: ContainerState): Promise<void> {
  const { spec, hostUid } = rec;
  const id = spec.id;
  const { layout: L, volumeGid } = host;
  const user = userOf(spec, hostUid);
  await host.makeRuntimeDirs(id);
  await mkdir(L.runDir(id), { recursive: true, mode: 0o700 });
  await chown(L.runDir(id), user.uid, user.gid);
  await writeOwned(path.join(L.runDir(id), "env"), envFile(sandboxEnv(spec, user)), user);
  if (spec.init.secret !== undefined) await writeOwned(path.join(L.runDir(id), "secret"), spec.init.secret, user);
  await writeFile(path.join(L.runtime(id), "resolv.conf"), host.networks.resolvConf(), { mode: 0o644 });
  for (const [i, v] of (spec.volumes ?? []).entries()) {
    await prepareVolumeRoot(v.root, volumeGid);
    await bindVolume(v, path.join(L.runtime(id), "volumes", String(i)), volumeGid);
  }
  if (!state.upperDir) throw errors.failedPrecondition(`sandbox ${id}: the engine's storage driver has no upper directory (overlay2 is required)`);
  await prepareUser(state.upperDir, spec.rootfs, user);
}

/** A file only the sandbox user (and root) can read. */
async function writeOwned(file: string, content: string, owner: { uid: number; gid: number }): Promise<void> {
  await rm(file, { force: true });
  await writeFile(file, content, { mode: 0o600, flag: "wx" });
  await chown(file, owner.uid, owner.gid);
}
