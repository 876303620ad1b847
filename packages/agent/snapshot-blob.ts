/**
 * The agent's V8 startup snapshot, made by build.ts beside the bundle: the
 * agent with Connect, protobuf and the core services already evaluated (see
 * src/snapshot.ts), so a sandbox's agent deserializes a heap instead of
 * compiling and evaluating those modules on its first call.
 *
 * A blob only loads in the node that built it (node refuses another version
 * or architecture and exits), and the runner runs the agent with its own node
 * (bound into the sandbox as /opt/sandbar/bin/node): the blob's name carries
 * the node version and architecture, and a node that finds no blob of its own
 * name in the bundle runs agent.mjs as before (snapshotNodeArgs).
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import * as path from "node:path";

/** The blob's file name for a node: `agent-v24.21.0-x64.blob`. */
export function snapshotBlobName(version = process.version, arch = process.arch): string {
  return `agent-${version}-${arch}.blob`;
}

/**
 * Node's flags that start the agent from the bundle's snapshot, given where the
 * bundle is on the host and where the sandbox sees it; [] (run agent.mjs) when
 * the bundle holds no blob for this node (another version, or built without).
 */
export function snapshotNodeArgs(hostBundleDir: string, sandboxBundleDir: string, version = process.version, arch = process.arch): string[] {
  const name = snapshotBlobName(version, arch);
  return existsSync(path.join(hostBundleDir, name)) ? ["--snapshot-blob", path.posix.join(sandboxBundleDir, name)] : [];
}

/** Runs this node's `--build-snapshot` on the bundled entry; writes outDir/<snapshotBlobName()> and returns its path. */
export async function buildSnapshotBlob(entry: string, outDir: string): Promise<string> {
  const blob = path.join(outDir, snapshotBlobName());
  await rm(blob, { force: true });
  const { code, stderr } = await run(process.execPath, ["--snapshot-blob", blob, "--build-snapshot", entry]);
  if (code !== 0) throw new Error(`building the agent's startup snapshot failed (${code}): ${stderr.trim().slice(-2000)}`);
  return blob;
}

function run(cmd: string, args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stderr }));
  });
}
