/**
 * PID 1 duties. Node cannot reap processes it did not spawn, and every orphan
 * in the sandbox is re-parented to PID 1. So when the agent finds itself PID 1
 * it replaces itself (execve) with a tiny POSIX shell loop that starts the
 * agent again as its only child, forwards termination signals to it, reaps
 * every orphan (a shell's wait collects any child), and exits with the
 * agent's status.
 */

import { writeErr } from "./util/stdio.ts";

/** Set in the child agent's environment so it does not re-exec again. */
export const INIT_MARKER = "SANDBAR_AGENT_UNDER_INIT";

const INIT_SCRIPT = [
  '"$@" &',
  "agent=$!",
  "for s in TERM INT HUP QUIT USR1 USR2; do trap \"kill -$s $agent 2>/dev/null\" $s; done",
  "status=0",
  // wait returns early (>128) when a trapped signal arrives; go on until the agent is gone.
  'while kill -0 "$agent" 2>/dev/null; do wait "$agent"; status=$?; done',
  'exit "$status"',
].join("\n");

/**
 * When running as PID 1, re-executes as `sh -c <init> node <script> <args>`
 * and never returns. Otherwise (or without /bin/sh) returns false and the
 * agent goes on. scriptAndArgs is process.argv without node itself.
 */
export function becomeInitIfPid1(scriptAndArgs: string[], execArgv: string[]): boolean {
  if (process.pid !== 1 || process.env[INIT_MARKER] === "1") return false;
  const sh = "/bin/sh";
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
  env[INIT_MARKER] = "1";
  try {
    process.execve!(sh, [sh, "-c", INIT_SCRIPT, "sandbar-init", process.execPath, ...execArgv, ...scriptAndArgs], env);
  } catch (err) {
    writeErr(`sandbar-agent: cannot become a reaping init (${(err as Error).message}); orphans will not be reaped\n`);
    return false;
  }
  return true;
}
