import { stat } from "node:fs/promises";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { GitService } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";
import type { AgentContext } from "../context.ts";
import { fsError } from "../util/fs-errors.ts";
import { resolvePath } from "../util/paths.ts";
import { git } from "./cli.ts";
import type { Credentials } from "./cli.ts";
import { parseStatus } from "./status.ts";

/** Credentials only when both parts are given, as the reference does. */
function credentialsOf(req: { username?: string; password?: string }): Credentials | undefined {
  return req.username && req.password ? { username: req.username, password: req.password } : undefined;
}

/** Hooks are the repository's business, not the toolbox's: never run them. */
const NO_HOOKS = ["-c", "core.hooksPath=/dev/null"];

export function createGitService(ctx: AgentContext): ServiceImpl<typeof GitService> {
  /** The repository dir of a request; it must exist. */
  const repo = async (p: string): Promise<string> => {
    const dir = resolvePath(ctx.workDir, p);
    try {
      if (!(await stat(dir)).isDirectory()) throw errors.invalidArgument(`not a directory: ${dir}`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") throw errors.notFound(`repository not found: ${dir}`);
      throw fsError(err, dir); // a path too long, a loop, no permission: the caller's to fix
    }
    return dir;
  };
  const run = (cwd: string, args: string[], signal?: AbortSignal, credentials?: Credentials, target?: string) =>
    git([...NO_HOOKS, ...args], { cwd, env: ctx.env, signal, credentials, target });

  const currentBranch = async (dir: string, signal?: AbortSignal): Promise<string> => {
    const { stdout } = await run(dir, ["symbolic-ref", "--quiet", "--short", "HEAD"], signal).catch(() => {
      throw errors.failedPrecondition("HEAD is detached: check out a branch first");
    });
    return stdout.trim();
  };

  return {
    async clone(req, call) {
      if (req.url.trim() === "") throw errors.invalidArgument("url is required");
      const dest = resolvePath(ctx.workDir, req.path);
      let url = req.url.trim();
      // A relative path is no URL (it would become https://./x): say what is accepted.
      if (/^\.\.?(\/|$)/.test(url) || url.startsWith("~")) {
        throw errors.invalidArgument(`url must be a URL (https://, ssh://, git@host:path, file://) or an absolute path, not ${JSON.stringify(url.slice(0, 200))}`);
      }
      if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(url) && !url.startsWith("/") && !/^[\w.-]+@[\w.-]+:/.test(url) && !url.startsWith("file:")) url = `https://${url}`;
      const args = ["clone", "--single-branch"];
      if (req.insecureSkipTls) args.unshift("-c", "http.sslVerify=false");
      if (req.branch) args.push("--branch", req.branch);
      args.push("--", url, dest);
      await run(ctx.workDir, args, call.signal, credentialsOf(req), dest);
      if (req.commitId) await run(dest, ["checkout", "--detach", req.commitId], call.signal);
      return {};
    },

    async add(req, call) {
      const dir = await repo(req.path);
      if (req.files.length === 0) throw errors.invalidArgument("files must name at least one path (\".\" for all)");
      await run(dir, ["add", "--", ...req.files], call.signal);
      return {};
    },

    async commit(req, call) {
      const dir = await repo(req.path);
      if (req.message.trim() === "") throw errors.invalidArgument("message is required");
      if (req.author.trim() === "" || req.email.trim() === "") throw errors.invalidArgument("author and email are required");
      // The message on stdin: as an argument, one over 128 KiB could not be passed (E2BIG).
      const args = ["-c", `user.name=${req.author}`, "-c", `user.email=${req.email}`, "commit", "--no-verify", "--cleanup=verbatim", "--file=-"];
      if (req.allowEmpty) args.push("--allow-empty");
      await git([...NO_HOOKS, ...args], {
        cwd: dir,
        input: req.message.endsWith("\n") ? req.message : `${req.message}\n`, // as -m ends it
        env: { ...ctx.env, GIT_AUTHOR_NAME: req.author, GIT_AUTHOR_EMAIL: req.email, GIT_COMMITTER_NAME: req.author, GIT_COMMITTER_EMAIL: req.email },
        signal: call.signal,
      });
      const { stdout } = await run(dir, ["rev-parse", "HEAD"], call.signal);
      return { hash: stdout.trim() };
    },

    async listBranches(req, call) {
      const dir = await repo(req.path);
      const { stdout } = await run(dir, ["for-each-ref", "--format=%(refname:short)", "refs/heads/"], call.signal);
      return { branches: stdout.split("\n").filter((b) => b !== "") };
    },

    async createBranch(req, call) {
      const dir = await repo(req.path);
      if (req.name.trim() === "") throw errors.invalidArgument("name is required");
      await run(dir, ["checkout", "-b", req.name], call.signal);
      return {};
    },

    async deleteBranch(req, call) {
      const dir = await repo(req.path);
      if (req.name.trim() === "") throw errors.invalidArgument("name is required");
      await run(dir, ["branch", "-D", "--", req.name], call.signal);
      return {};
    },

    async checkout(req, call) {
      const dir = await repo(req.path);
      if (req.branch.trim() === "") throw errors.invalidArgument("branch is required");
      const isBranch = await run(dir, ["show-ref", "--verify", "--quiet", `refs/heads/${req.branch}`], call.signal).then(
        () => true,
        () => false,
      );
      if (isBranch) await run(dir, ["checkout", req.branch], call.signal);
      else {
        const commit = await run(dir, ["rev-parse", "--verify", "--quiet", `${req.branch}^{commit}`], call.signal).catch(() => {
          throw errors.notFound(`no branch or commit named ${req.branch}`);
        });
        await run(dir, ["checkout", "--detach", commit.stdout.trim()], call.signal);
      }
      return {};
    },

    async getStatus(req, call) {
      const dir = await repo(req.path);
      const { stdout } = await run(dir, ["status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all"], call.signal);
      const s = parseStatus(stdout);
      return {
        currentBranch: s.currentBranch,
        fileStatus: s.fileStatus,
        ahead: s.ahead,
        behind: s.behind,
        branchPublished: s.upstream !== undefined,
      };
    },

    async getHistory(req, call) {
      const dir = await repo(req.path);
      // An empty repository has no history rather than an error.
      const hasHead = await run(dir, ["rev-parse", "--verify", "--quiet", "HEAD"], call.signal).then(() => true, () => false);
      if (!hasHead) {
        await run(dir, ["rev-parse", "--git-dir"], call.signal);
        return { commits: [] };
      }
      const { stdout } = await run(dir, ["log", "--format=%H%x1f%an%x1f%ae%x1f%at%x1f%B%x1e", "HEAD"], call.signal);
      const commits = stdout
        .split("\x1e")
        .map((r) => r.replace(/^\n/, ""))
        .filter((r) => r !== "")
        .map((r) => {
          const [hash, author, email, at, message] = r.split("\x1f");
          return { hash, author, email, message, timestamp: timestampFromMs(Number(at) * 1000) };
        });
      return { commits };
    },

    async pull(req, call) {
      const dir = await repo(req.path);
      const branch = await currentBranch(dir, call.signal);
      await run(dir, ["pull", "--ff-only", "--no-rebase", "origin", branch], call.signal, credentialsOf(req));
      return {};
    },

    async push(req, call) {
      const dir = await repo(req.path);
      const branch = await currentBranch(dir, call.signal);
      await run(dir, ["push", "--set-upstream", "origin", `refs/heads/${branch}:refs/heads/${branch}`], call.signal, credentialsOf(req));
      return {};
    },
  };
}
