import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";

/** The CLI's entry point, run with the node running the tests. */
export const CLI = fileURLToPath(new URL("../../packages/cli/src/main.ts", import.meta.url));

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `sandbar args...` as a child process (pipes, no TTY) with exactly the given Sandbar
 * variables: the test's own SANDBAR_* and NO_COLOR are not inherited, so each case says what it sets.
 */
export function sandbar(args: string[], env: Record<string, string | undefined> = {}, opts: { cwd?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SANDBAR_") && k !== "NO_COLOR" && k !== "FORCE_COLOR"));
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { env: { ...base, ...env }, cwd: opts.cwd, timeout: opts.timeoutMs ?? 60_000, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === "number" ? (err as { code: number }).code : 1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}
