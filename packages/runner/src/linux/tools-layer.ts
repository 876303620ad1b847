import { createHash, randomBytes } from "node:crypto";
import { copyFile, link, mkdir, readdir, rename, rm, stat, symlink, readlink, lstat } from "node:fs/promises";
import path from "node:path";
import { SANDBOX_PATHS } from "../provider.ts";

// What the runner puts into every sandbox (the init shell, node, the agent bundle) as the top
// read-only lower layer of its overlay root, instead of bind mounts: a bind mount shows its host
// source path in the sandbox's mount table (findmnt, /proc/self/mountinfo); a lower layer shows
// nothing, and overlayfs reads it with the runner's credentials, so no host path needs to be
// reachable by the sandbox uid. Files are hard links (a copy across filesystems). Building one
// costs 15-25 ms (the bundle is a few hundred files), so a layer is built once per set of tools
// and shared by every sandbox that runs them (SharedToolsLayers), as the snapshot's rootfs is.

export interface ToolsLayerInput {
  initSh: string;
  node: string;
  /** An agent bundle directory (with its entry `main`), or one script file. */
  bundle: string;
  main?: string;
}

/** Builds the layer in `dir` (replacing an earlier one); returns the agent's entry script inside the sandbox. */
async function buildToolsLayer(dir: string, t: ToolsLayerInput): Promise<{ agentEntry: string }> {
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

/**
 * Tools layers under `dir`, one per set of tools, shared by every sandbox started with them. A
 * layer is named by the identity of its inputs (path, device, inode, size, mtime of the init
 * shell, node, the bundle and its entry): rebuilding the bundle (build.ts makes its directory
 * anew) or replacing node names a new layer. Built aside and renamed into place, so a layer
 * seen is complete. A new layer removes the older ones no sandbox dir links to (`inUse`) and
 * this process has not handed out.
 */
export class SharedToolsLayers {
  readonly #dir: string;
  readonly #inUse: () => Promise<Set<string>>;
  readonly #building = new Map<string, Promise<string>>();
  /** Layers this process handed out: a start may hold one before its overlay links to it. */
  readonly #handedOut = new Set<string>();

  constructor(dir: string, inUse: () => Promise<Set<string>>) {
    this.#dir = dir;
    this.#inUse = inUse;
  }

  /** The layer for these tools (built on first use); returns its directory and the agent's entry inside the sandbox. */
  async layer(t: ToolsLayerInput): Promise<{ dir: string; agentEntry: string }> {
    const isDir = (await stat(t.bundle)).isDirectory();
    const agentEntry = path.join(SANDBOX_PATHS.agent, isDir ? t.main! : path.basename(t.bundle));
    const key = await toolsKey(t, isDir);
    const dir = path.join(this.#dir, key);
    if (!(await stat(dir).then(() => true, () => false))) {
      let building = this.#building.get(key);
      if (!building) {
        building = this.#build(key, t).finally(() => this.#building.delete(key));
        this.#building.set(key, building);
      }
      await building;
    }
    this.#handedOut.add(dir);
    return { dir, agentEntry };
  }

  async #build(key: string, t: ToolsLayerInput): Promise<string> {
    const dir = path.join(this.#dir, key);
    const tmp = path.join(this.#dir, `.${key}.${randomBytes(4).toString("hex")}`);
    await mkdir(this.#dir, { recursive: true, mode: 0o700 });
    try {
      await buildToolsLayer(tmp, t);
      await rename(tmp, dir).catch(async (err: NodeJS.ErrnoException) => {
        // Another runner process on the same data dir made it first: same inputs, same layer.
        if (err.code !== "ENOTEMPTY" && err.code !== "EEXIST") throw err;
      });
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
    await this.#removeUnused(key);
    return dir;
  }

  /** Layers of earlier tools that no sandbox links to any more. */
  async #removeUnused(current: string): Promise<void> {
    const used = await this.#inUse();
    for (const d of this.#handedOut) used.add(d);
    for (const name of await readdir(this.#dir)) {
      if (name === current || name.startsWith(".") || used.has(path.join(this.#dir, name))) continue;
      await rm(path.join(this.#dir, name), { recursive: true, force: true });
    }
  }
}

async function toolsKey(t: ToolsLayerInput, isDir: boolean): Promise<string> {
  const files = [t.initSh, t.node, t.bundle, ...(isDir ? [path.join(t.bundle, t.main!)] : [])];
  const ids = await Promise.all(
    files.map(async (f) => {
      const s = await stat(f, { bigint: true });
      return [path.resolve(f), s.dev, s.ino, s.size, s.mtimeNs].join(":");
    }),
  );
  return createHash("sha256").update(ids.join("\n")).digest("hex").slice(0, 24);
}
