import { spawn } from "node:child_process";
import { chmod, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const AGENT_BUILD = fileURLToPath(new URL("../../build.ts", import.meta.url));

/**
 * Bundles the agent (build.ts, in a child process) into a fresh scratch directory that sandbox
 * users can reach, for tests that run the real agent in real sandboxes. The caller removes it.
 */
export async function buildAgentBundle(prefix = "sandbar-agent-bundle-"): Promise<string> {
  const bundle = await mkdtemp(join(tmpdir(), prefix));
  await chmod(bundle, 0o755);
  await new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [AGENT_BUILD, bundle], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    child.stderr.on("data", (c: Buffer) => (err += c.toString()));
    child.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`agent build failed (${code}): ${err}`))));
  });
  return bundle;
}
