/**
 * Node's compile cache for the agent bundle, made once at build time so no
 * sandbox compiles the bundle's JavaScript again (build.ts calls it).
 *
 * The bundle's entry (agent.mjs, LOADER below) turns the cache on for
 * dist/compile-cache before it imports the agent (main.mjs). Here the built
 * agent runs once against a throwaway socket and answers the calls every
 * sandbox's first minute makes (info, files, processes), so the modules they
 * load get their entries; node writes them when the agent exits.
 *
 * Node keys the cache by itself: a subdirectory per node version, V8 flags and
 * the uid that runs it (`v24.21.0-x64-<tag>-<uid>`), an entry per module with
 * the module's content hash; "portable" keys modules by their path relative to
 * the cache, so the entries hold wherever the bundle is mounted. A node of
 * another version, or a changed module, misses and compiles as before; where
 * the cache cannot be written (a sandbox's read-only bundle) node goes on
 * without writing. The agent runs as uid 0 or 1000 in a sandbox: those
 * subdirectories are links to the one made here. Files are made readable by
 * all: the sandbox's uid is not the builder's.
 */
import { spawn } from "node:child_process";
import { chmod, mkdtemp, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createClient } from "@connectrpc/connect";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { agentTransport } from "./src/client.ts";

const COMPILE_CACHE_DIR = "compile-cache";
export const AGENT_MAIN = "main.mjs";
/** The uids an agent runs as inside a sandbox (the runner's root and sandbox user). */
const SANDBOX_UIDS = [0, 1000];

/** The bundle's entry: turns the compile cache on, then loads the agent (dynamically: after the cache is on). */
export const LOADER = `#!/usr/bin/env node
// The agent's entry: Node's compile cache (made at build time, see compile-cache.ts) on, then the agent.
import module from "node:module";
import { fileURLToPath } from "node:url";
module.enableCompileCache?.({ directory: fileURLToPath(new URL("./${COMPILE_CACHE_DIR}", import.meta.url)), portable: true });
await import("./${AGENT_MAIN}");
`;

/** Runs the built agent in `outDir` once to fill outDir/compile-cache; returns the number of cached modules. */
export async function buildCompileCache(outDir: string, node = process.execPath): Promise<number> {
  const cacheDir = path.join(outDir, COMPILE_CACHE_DIR);
  await rm(cacheDir, { recursive: true, force: true });
  const scratch = await mkdtemp(path.join(tmpdir(), "sandbar-agent-cc-"));
  try {
    const socket = path.join(scratch, "agent.sock");
    const secret = "compile-cache";
    await writeFile(path.join(scratch, "secret"), secret, { mode: 0o600 });
    const args = [path.join(outDir, "agent.mjs"), "--socket", socket, "--secret-file", path.join(scratch, "secret"), "--root", scratch, "--state-dir", path.join(scratch, "state"), "--preload"];
    const child = spawn(node, args, { stdio: ["ignore", "pipe", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: scratch } });
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.once("data", () => resolve());
        exited.then((code) => reject(new Error(`the agent exited with ${code} before it was ready: ${stderr.trim()}`)));
      });
      const transport = agentTransport(socket, secret);
      await createClient(InfoService, transport).getVersion({});
      await createClient(FileService, transport).listFiles({ path: scratch });
      await createClient(ProcessService, transport).execute({ command: "true" });
    } finally {
      child.kill("SIGTERM");
    }
    // Node writes the cache as the agent exits.
    if ((await exited) !== 0) throw new Error(`the agent did not exit cleanly: ${stderr.trim()}`);
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
  const made = await readdir(cacheDir);
  if (made.length !== 1) throw new Error(`expected one cache directory in ${cacheDir}, found ${made.length}`);
  const [dir] = made;
  const entries = await readdir(path.join(cacheDir, dir));
  await chmod(cacheDir, 0o755);
  await chmod(path.join(cacheDir, dir), 0o755);
  for (const e of entries) await chmod(path.join(cacheDir, dir, e), 0o644);
  const prefix = dir.slice(0, dir.lastIndexOf("-") + 1);
  for (const uid of SANDBOX_UIDS) {
    const name = `${prefix}${uid}`;
    if (!(await stat(path.join(cacheDir, name)).catch(() => undefined))) await symlink(dir, path.join(cacheDir, name));
  }
  return entries.length;
}
