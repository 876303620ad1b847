import type { Stats } from "node:fs";
import { stat } from "node:fs/promises";
import path from "node:path";
import { errors } from "@sandbar/protocol";
import type { SandboxSpec } from "../provider.ts";

// Checks on host paths named in a spec, done at create time so a bad spec fails with a clear
// message instead of an obscure bwrap error at start.

export async function statOrFail(what: string, p: string): Promise<Stats> {
  try {
    return await stat(p);
  } catch {
    throw errors.failedPrecondition(`${what} ${p} does not exist on this runner`);
  }
}

/**
 * bwrap resolves bind sources as the sandbox's host uid, so every directory above `p` must be
 * searchable by others (o+x). Fails with the first directory that is not.
 */
export async function assertReachable(what: string, p: string): Promise<void> {
  let dir = path.dirname(p);
  const blocked: string[] = [];
  for (;;) {
    const st = await stat(dir);
    if ((st.mode & 0o001) === 0) blocked.push(dir);
    if (dir === "/") break;
    dir = path.dirname(dir);
  }
  if (blocked.length > 0) {
    throw errors.failedPrecondition(
      `${what} ${p} is not reachable by sandbox users: ${blocked[blocked.length - 1]} is not searchable by others (o+x); place it under a world-searchable directory`,
    );
  }
}

/** The spec's root and first process exist: a directory, node's file, the bundle (and its main script). */
export async function checkRootAndInit(spec: SandboxSpec): Promise<void> {
  if (!(await statOrFail("rootfs", spec.rootfs)).isDirectory()) throw errors.failedPrecondition(`rootfs ${spec.rootfs} is not a directory`);
  if (!(await statOrFail("init.node", spec.init.node)).isFile()) throw errors.failedPrecondition(`init.node ${spec.init.node} is not a file`);
  const bundle = await statOrFail("init.bundle", spec.init.bundle);
  if (bundle.isDirectory()) {
    if (!spec.init.main) throw errors.invalidArgument(`init.main is required: init.bundle ${spec.init.bundle} is a directory`);
    await statOrFail("init.main", path.join(spec.init.bundle, spec.init.main));
  }
}
