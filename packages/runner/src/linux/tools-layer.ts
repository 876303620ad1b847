import { copyFile, link, mkdir, readdir, rm, stat, symlink, readlink, lstat } from "node:fs/promises";
import path from "node:path";
import { SANDBOX_PATHS } from "../provider.ts";

// What the runner puts into every sandbox (the init shell, node, the agent bundle) as the top
// read-only lower layer of its overlay root, instead of bind mounts: a bind mount shows its host
// source path in the sandbox's mount table (findmnt, /proc/self/mountinfo); a lower layer shows
// nothing, and overlayfs reads it with the runner's credentials, so no host path needs to be
// reachable by the sandbox uid. Files are hard links (a copy across filesystems): building the
// layer at each start costs a few milliseconds and always matches the sandbox's spec.

export interface ToolsLayerInput {
  initSh: string;
  node: string;
  /** An agent bundle directory (with its entry `main`), or one script file. */
  bundle: string;
  main?: string;
}

/** Builds the layer in `dir` (replacing an earlier one); returns the agent's entry script inside the sandbox. */
export async function buildToolsLayer(dir: string, t: ToolsLayerInput): Promise<{ agentEntry: string }> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(path.join(dir, path.dirname(SANDBOX_PATHS.node).slice(1)), { recursive: true, mode: 0o755 });
  await place(t.initSh, path.join(dir, SANDBOX_PATHS.init));
  await place(t.node, path.join(dir, SANDBOX_PATHS.node));
  const agentDir = path.join(dir, SANDBOX_PATHS.agent);
  if ((await stat(t.bundle)).isDirectory()) {
    await placeTree(t.bundle, agentDir);
    return { agentEntry: path.join(SANDBOX_PATHS.agent, t.main!) };
  }
  await mkdir(agentDir, { recursive: true, mode: 0o755 });
  await place(t.bundle, path.join(agentDir, path.basename(t.bundle)));
  return { agentEntry: path.join(SANDBOX_PATHS.agent, path.basename(t.bundle)) };
}

async function place(source: string, target: string): Promise<void> {
  try {
    await link(source, target);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EXDEV") throw err;
    await copyFile(source, target);
  }
}

async function placeTree(source: string, target: string): Promise<void> {
  await mkdir(target, { recursive: true, mode: 0o755 });
  for (const name of await readdir(source)) {
    const from = path.join(source, name);
    const to = path.join(target, name);
    const st = await lstat(from);
    if (st.isDirectory()) await placeTree(from, to);
    else if (st.isSymbolicLink()) await symlink(await readlink(from), to);
    else await place(from, to);
  }
}
