import { spawn } from "node:child_process";
import { accessSync, constants } from "node:fs";
import path from "node:path";
import { spawner } from "./spawner.ts";

// Runs the host tools the provider orchestrates (mount, mkfs, tar, ...) and turns their
// failures into errors that quote the command and its stderr. They are started by the runner's
// spawner process when it runs (spawner.ts: a fork of a small process is cheaper).

export class CommandError extends Error {
  readonly code: number | null;
  readonly stderr: string;
  constructor(cmd: string, args: readonly string[], code: number | null, signal: string | null, stderr: string) {
    const how = signal ? `was killed by ${signal}` : `exited with ${code}`;
    super(`${[cmd, ...args].join(" ")} ${how}${stderr.trim() ? `: ${stderr.trim()}` : ""}`);
    this.code = code;
    this.stderr = stderr;
  }
}

export interface RunResult {
  stdout: string;
  stderr: string;
}

/** Runs a command to completion; rejects with CommandError when it fails. Output is kept small. */
export async function run(cmd: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; /** Written to stdin. */ input?: string } = {}): Promise<RunResult> {
  const helper = spawner();
  if (helper) {
    const r = await helper.run({ cmd, args, cwd: options.cwd, env: options.env ?? process.env, input: options.input });
    if (r.code === 0) return { stdout: r.stdout, stderr: r.stderr };
    throw new CommandError(cmd, args, r.code, r.signal, r.stderr);
  }
  return new Promise((resolve, reject) => {
    // Its own process group, as from the spawner: a Ctrl-C to the runner's group must not cut a teardown's umount short.
    const child = spawn(cmd, args, { stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"], env: options.env ?? process.env, cwd: options.cwd, detached: true });
    if (options.input !== undefined) child.stdin?.end(options.input);
    let stdout = "";
    let stderr = "";
    const cap = (acc: string, chunk: Buffer) => (acc.length > 65536 ? acc : acc + chunk.toString());
    child.stdout?.on("data", (c: Buffer) => (stdout = cap(stdout, c)));
    child.stderr?.on("data", (c: Buffer) => (stderr = cap(stderr, c)));
    child.on("error", (err) => reject(new Error(`cannot run ${cmd}: ${err.message}`)));
    child.on("close", (code, signal) => {
      if (code === 0) resolve({ stdout, stderr });
      else reject(new CommandError(cmd, args, code, signal, stderr));
    });
  });
}

/** Absolute path of an executable on PATH (plus the sbin directories), or undefined. */
export function which(name: string): string | undefined {
  const dirs = (process.env.PATH ?? "").split(":").concat(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"]);
  for (const dir of dirs) {
    if (!dir) continue;
    const p = path.join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // keep looking
    }
  }
  return undefined;
}
