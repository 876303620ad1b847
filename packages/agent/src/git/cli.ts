import { spawn } from "node:child_process";
import { Code, ConnectError } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { asUserProcess } from "../process/user-spawn.ts";
import { diskFull, saysDiskFull } from "../util/fs-errors.ts";

/** HTTP basic credentials for one call. */
export interface Credentials {
  username: string;
  password: string;
}

/** Most output a git call may produce before it is cut (history of a huge repository). */
const OUTPUT_LIMIT = 64 * 1024 * 1024;

/**
 * A credential helper defined inline: it answers git's "get" with the
 * username and password from this call's environment, so they never reach
 * argv, a file, the remote URL or a log. The empty helper before it drops any
 * helper the user configured (which could store them).
 */
const HELPER = '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" "$SANDBAR_GIT_USERNAME" "$SANDBAR_GIT_PASSWORD"; }; f';

export interface GitRunOptions {
  cwd: string;
  env: NodeJS.ProcessEnv;
  credentials?: Credentials;
  signal?: AbortSignal;
  /** Written to git's stdin (a commit message: argv holds at most 128 KiB per argument). */
  input?: string;
  /** The directory the call writes (a clone's destination); default cwd. Named by a disk-full error. */
  target?: string;
}

export interface GitResult {
  stdout: string;
  stderr: string;
}

/** Removes credentials from text git printed (error messages may echo URLs). */
function redact(text: string, credentials?: Credentials): string {
  let out = text.replace(/(\w+:\/\/)[^/@\s]+@/g, "$1***@");
  for (const secret of [credentials?.password, credentials?.username]) {
    if (secret && secret.length >= 3) out = out.replaceAll(secret, "***");
  }
  return out;
}

/** Runs git; a non-zero exit becomes the ConnectError its message calls for. */
export function git(args: string[], opts: GitRunOptions): Promise<GitResult> {
  const env: NodeJS.ProcessEnv = {
    ...opts.env,
    GIT_TERMINAL_PROMPT: "0",
    GIT_ASKPASS: "",
    SSH_ASKPASS: "",
    LC_ALL: "C",
  };
  const pre: string[] = [];
  if (opts.credentials) {
    env.SANDBAR_GIT_USERNAME = opts.credentials.username;
    env.SANDBAR_GIT_PASSWORD = opts.credentials.password;
    pre.push("-c", "credential.helper=", "-c", `credential.helper=${HELPER}`);
  }
  return new Promise((resolve, reject) => {
    const child = spawn(...asUserProcess("git", [...pre, ...args], env), { cwd: opts.cwd, env, stdio: [opts.input === undefined ? "ignore" : "pipe", "pipe", "pipe"], signal: opts.signal });
    // git may exit before reading it all (a refused commit): EPIPE is not the failure to report.
    child.stdin?.on("error", () => undefined).end(opts.input);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outBytes = 0;
    child.stdout!.on("data", (d: Buffer) => {
      if (outBytes < OUTPUT_LIMIT) out.push(d);
      outBytes += d.length;
    });
    child.stderr!.on("data", (d: Buffer) => err.push(d));
    child.once("error", (e) => {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") reject(errors.unavailable("git is not installed in this sandbox"));
      else if ((e as NodeJS.ErrnoException).code === "E2BIG") reject(errors.invalidArgument("git's arguments and environment are larger than the kernel takes (128 KiB per argument)"));
      else if (e.name === "AbortError") reject(errors.unavailable("git call cancelled"));
      else reject(errors.internal(`cannot run git: ${e.message}`));
    });
    child.once("close", (code) => {
      const stdout = Buffer.concat(out).toString("utf8");
      const stderr = redact(Buffer.concat(err).toString("utf8"), opts.credentials);
      if (code === 0) resolve({ stdout, stderr });
      else reject(gitError(stderr || stdout, args, opts.target ?? opts.cwd));
    });
  });
}

const MAX_ERROR_TEXT = 2000;

/** Classifies a failed git call by its message, as the reference does; `target` is the directory it wrote. */
function gitError(message: string, args: string[], target?: string): ConnectError {
  const full = message.trim().replace(/^(fatal|error): /gm, "") || `git ${args[0]} failed`;
  // Errors travel as HTTP/2 headers: git's text (which echoes paths and URLs) is kept short.
  const text = full.length > MAX_ERROR_TEXT ? `${full.slice(0, MAX_ERROR_TEXT)}…` : full;
  const m = message.toLowerCase();
  // Before the patterns below: git's words for a full disk name files that "could not be created".
  if (saysDiskFull(m)) return diskFull(target === undefined ? text : `${target} (${text})`, /disk quota exceeded/.test(m));
  if (/authentication failed|could not read username|could not read password|terminal prompts disabled|http 401|401 unauthorized|invalid username or password/.test(m)) {
    return new ConnectError(`authentication failed: ${text}`, Code.Unauthenticated);
  }
  if (/a branch named .* already exists/.test(m)) return errors.alreadyExists(text);
  if (/http 403|403 forbidden|permission to .* denied/.test(m)) return errors.permissionDenied(text);
  if (/already exists|non-fast-forward|\[rejected\]|not possible to fast-forward|would be overwritten|uncommitted changes|nothing to commit|nothing added to commit|cannot delete branch .* (checked out|used by worktree)|not fully merged|conflict|needs merge|you are in the middle/.test(m)) {
    return errors.failedPrecondition(text);
  }
  if (/not a git repository|repository .* not found|does not exist|not found|did not match any|unknown revision|invalid reference|couldn't find remote ref|no such file|bad revision|ambiguous argument|pathspec/.test(m)) {
    return errors.notFound(text);
  }
  // What is left is git refusing the request (an unreachable or malformed remote, a bad
  // argument): the caller's to fix, with git's own words. A git that could not run at all is
  // reported where it is spawned.
  return errors.invalidArgument(text);
}
