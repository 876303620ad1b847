/**
 * Where the agent's children for the user go. In a sandbox the runner hands the agent the procs
 * file(s) of the sandbox's user cgroup (`--user-cgroup`, one per cgroup v1 hierarchy): what the
 * agent starts for the user joins it, so a fork storm or a memory hog exhausts the user's budget
 * and never the agent's reserve. The runner also makes the agent unkillable by the OOM killer
 * (oom_score_adj -1000, inherited by children): user processes raise theirs again.
 *
 * A tiny /bin/sh wrapper does both between fork and exec (the pid stays the same, so callers
 * keep their ChildProcess, process group and pipes). Joining is best effort: a process that
 * cannot join still runs, in the agent's group.
 */

import { accessSync, constants } from "node:fs";
import * as path from "node:path";
import { shellQuote } from "../util/shell.ts";

/**
 * oom_score_adj of user processes: the most, so the OOM killer takes any user process before the
 * agent even where the host could not give the agent -1000, and before host services when the
 * host itself runs short. Among user processes the largest still goes first.
 */
export const USER_OOM_SCORE_ADJ = 1000;

const JOIN =
  'while [ "$1" != -- ]; do { echo 0 >"$1"; } 2>/dev/null; shift; done; shift; ' +
  `{ echo ${USER_OOM_SCORE_ADJ} >/proc/self/oom_score_adj; } 2>/dev/null; exec "$@"`;

let procsFiles: readonly string[] = [];

/** Set once at start from the agent's arguments; none (outside a sandbox) means no wrapper. */
export function setUserCgroup(files: readonly string[]): void {
  procsFiles = [...files];
}

/**
 * The command and arguments to spawn instead of `file args`, so it runs as a user process. A
 * command that cannot be found on `env.PATH` is left as it is: spawning it then fails with
 * ENOENT as before, which callers turn into "... is not installed".
 */
export function asUserProcess(file: string, args: readonly string[], env: NodeJS.ProcessEnv = process.env): [string, string[]] {
  if (procsFiles.length === 0 || !findable(file, env.PATH)) return [file, [...args]];
  return ["/bin/sh", ["-c", JOIN, "sandbar-user", ...procsFiles, "--", file, ...args]];
}

/**
 * What a POSIX shell runs first to make itself a user process, the wrapper's work without its
 * exec: for shells the agent starts with a script of its own (the subshell hosts), one exec less.
 * `strict`: a shell that cannot join exits (127) rather than run user code in the agent's group.
 * Empty outside a sandbox.
 */
export function userJoinPrelude(strict = false): string {
  if (procsFiles.length === 0) return "";
  const orExit = strict ? " || exit 127" : "";
  return procsFiles.map((f) => `{ echo 0 >${shellQuote(f)}; } 2>/dev/null${orExit}; `).join("") + `{ echo ${USER_OOM_SCORE_ADJ} >/proc/self/oom_score_adj; } 2>/dev/null; `;
}

function findable(file: string, pathVar = ""): boolean {
  const candidates = file.includes("/") ? [file] : pathVar.split(":").filter(Boolean).map((d) => path.join(d, file));
  return candidates.some((c) => {
    try {
      accessSync(c, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}
