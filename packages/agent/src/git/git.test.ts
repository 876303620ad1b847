import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFileSync } from "node:child_process";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { GitFileStatus, GitService } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";
import { startGitHttpServer } from "../testing/git-http-server.ts";
import type { GitHttpServer } from "../testing/git-http-server.ts";

let agent: AgentProcess;
let g: ReturnType<typeof agent.client<typeof GitService>>;
let remotes: string;
const USER = "alice";
const PASSWORD = "pw-Zq8vXr2LmT5";

/** Runs git outside the agent, as a second user of the same remote. */
function sh(cwd: string, ...args: string[]): string {
  return execFileSync("git", ["-c", "init.defaultBranch=main", "-c", "user.name=Bob", "-c", "user.email=bob@example.com", ...args], {
    cwd,
    env: { ...process.env, HOME: cwd, GIT_CONFIG_NOSYSTEM: "1" },
    encoding: "utf8",
  });
}

/** A bare repository `name` under remotes with one commit on main. */
async function makeRemote(name: string): Promise<string> {
  const bare = path.join(remotes, name);
  const seed = path.join(remotes, `${name}-seed`);
  sh(remotes, "init", "--bare", bare);
  sh(remotes, "clone", bare, seed);
  await writeFile(path.join(seed, "README.md"), "# seed\n");
  sh(seed, "add", ".");
  sh(seed, "commit", "-m", "seed");
  sh(seed, "push", "origin", "HEAD:main");
  sh(bare, "symbolic-ref", "HEAD", "refs/heads/main");
  return bare;
}

const errOf = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => ConnectError.from(e));

/** Every file below dir, recursively. */
async function filesBelow(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) if (e.isFile()) out.push(path.join(e.parentPath, e.name));
  return out;
}

beforeAll(async () => {
  agent = await startAgentProcess();
  g = agent.client(GitService);
  remotes = path.join(agent.dir, "remotes");
  await mkdir(remotes);
});
afterAll(async () => {
  await agent?.stop();
});

describe("git with a local bare remote", () => {
  let bare: string;
  const repo = "work";
  beforeAll(async () => {
    bare = await makeRemote("local.git");
    await g.clone({ url: bare, path: repo });
  });

  it("clones, and reports a clean status on a published branch", async () => {
    expect(await readFile(path.join(agent.root, repo, "README.md"), "utf8")).toBe("# seed\n");
    const s = await g.getStatus({ path: repo });
    expect(s).toMatchObject({ currentBranch: "main", ahead: 0, behind: 0, branchPublished: true, fileStatus: [] });
  });

  it("adds and commits with author, returns the sha; history lists it first", async () => {
    await writeFile(path.join(agent.root, repo, "a.txt"), "A\n");
    await g.add({ path: repo, files: ["a.txt"] });
    const { hash } = await g.commit({ path: repo, message: "add a\n\nbody", author: "Ann Author", email: "ann@example.com" });
    expect(hash).toMatch(/^[0-9a-f]{40}$/);
    expect(sh(path.join(agent.root, repo), "rev-parse", "HEAD").trim()).toBe(hash);
    expect(sh(path.join(agent.root, repo), "log", "-1", "--format=%an <%ae>|%cn <%ce>").trim()).toBe("Ann Author <ann@example.com>|Ann Author <ann@example.com>");
    const { commits } = await g.getHistory({ path: repo });
    expect(commits.map((c) => c.message)).toEqual(["add a\n\nbody\n", "seed\n"]);
    expect(commits[0]).toMatchObject({ hash, author: "Ann Author", email: "ann@example.com" });
    expect(Math.abs(Number(commits[0].timestamp!.seconds) - Date.now() / 1000)).toBeLessThan(60);
    const s = await g.getStatus({ path: repo });
    expect(s).toMatchObject({ ahead: 1, behind: 0, branchPublished: true });
    // Nothing staged: refused unless allow_empty.
    expect((await errOf(g.commit({ path: repo, message: "empty", author: "A", email: "a@x" })))?.code).toBe(Code.FailedPrecondition);
    const empty = await g.commit({ path: repo, message: "empty", author: "A", email: "a@x", allowEmpty: true });
    expect(empty.hash).not.toBe(hash);
  });

  it("reports per-file staging and worktree status in the reference's words", async () => {
    const dir = path.join(agent.root, repo);
    await writeFile(path.join(dir, "new.txt"), "n\n");
    await writeFile(path.join(dir, "staged.txt"), "s\n");
    await g.add({ path: repo, files: ["staged.txt"] });
    await writeFile(path.join(dir, "README.md"), "# changed\n");
    await rm(path.join(dir, "a.txt"));
    const { fileStatus } = await g.getStatus({ path: repo });
    const by = Object.fromEntries(fileStatus.map((f) => [f.name, [f.staging, f.worktree]]));
    expect(by).toEqual({
      "new.txt": [GitFileStatus.UNTRACKED, GitFileStatus.UNTRACKED],
      "staged.txt": [GitFileStatus.ADDED, GitFileStatus.UNMODIFIED],
      "README.md": [GitFileStatus.UNMODIFIED, GitFileStatus.MODIFIED],
      "a.txt": [GitFileStatus.UNMODIFIED, GitFileStatus.DELETED],
    });
    await g.add({ path: repo, files: ["."] });
    await g.commit({ path: repo, message: "changes", author: "A", email: "a@x" });
    sh(dir, "mv", "staged.txt", "moved.txt");
    const after = await g.getStatus({ path: repo });
    expect(after.fileStatus).toEqual([expect.objectContaining({ name: "moved.txt", staging: GitFileStatus.RENAMED, worktree: GitFileStatus.UNMODIFIED, extra: "staged.txt" })]);
    await g.commit({ path: repo, message: "rename", author: "A", email: "a@x" });
  });

  it("lists, creates (and checks out), deletes branches; checks out a branch or a commit", async () => {
    await g.createBranch({ path: repo, name: "feature" });
    expect((await g.getStatus({ path: repo })).currentBranch).toBe("feature");
    expect((await g.listBranches({ path: repo })).branches.sort()).toEqual(["feature", "main"]);
    expect((await errOf(g.createBranch({ path: repo, name: "feature" })))?.code).toBe(Code.AlreadyExists);
    expect((await errOf(g.deleteBranch({ path: repo, name: "feature" })))?.code).toBe(Code.FailedPrecondition);
    await g.checkout({ path: repo, branch: "main" });
    expect((await g.getStatus({ path: repo })).currentBranch).toBe("main");
    await g.deleteBranch({ path: repo, name: "feature" });
    expect((await g.listBranches({ path: repo })).branches).toEqual(["main"]);
    expect((await errOf(g.deleteBranch({ path: repo, name: "feature" })))?.code).toBe(Code.NotFound);
    const { commits } = await g.getHistory({ path: repo });
    const seed = commits.at(-1)!.hash;
    await g.checkout({ path: repo, branch: seed });
    expect((await g.getStatus({ path: repo })).currentBranch).toBe("HEAD");
    expect((await errOf(g.push({ path: repo })))?.code).toBe(Code.FailedPrecondition);
    expect((await errOf(g.checkout({ path: repo, branch: "no-such-thing" })))?.code).toBe(Code.NotFound);
    await g.checkout({ path: repo, branch: "main" });
  });

  it("pushes to and pulls from the remote; a non-fast-forward push is refused", async () => {
    await g.push({ path: repo });
    expect(sh(bare, "rev-parse", "main").trim()).toBe(sh(path.join(agent.root, repo), "rev-parse", "HEAD").trim());
    expect((await g.getStatus({ path: repo })).ahead).toBe(0);
    // Someone else pushes.
    const other = path.join(remotes, "other");
    sh(remotes, "clone", bare, other);
    await writeFile(path.join(other, "theirs.txt"), "t\n");
    sh(other, "add", ".");
    sh(other, "commit", "-m", "theirs");
    sh(other, "push", "origin", "main");
    await g.pull({ path: repo });
    expect(await readFile(path.join(agent.root, repo, "theirs.txt"), "utf8")).toBe("t\n");
    // Diverge: they push again, we commit locally; our push is refused.
    await writeFile(path.join(other, "theirs2.txt"), "t2\n");
    sh(other, "add", ".");
    sh(other, "commit", "-m", "theirs2");
    sh(other, "push", "origin", "main");
    await writeFile(path.join(agent.root, repo, "ours.txt"), "o\n");
    await g.add({ path: repo, files: ["ours.txt"] });
    await g.commit({ path: repo, message: "ours", author: "A", email: "a@x" });
    const pushErr = await errOf(g.push({ path: repo }));
    expect(pushErr?.code).toBe(Code.FailedPrecondition);
    const pullErr = await errOf(g.pull({ path: repo }));
    expect(pullErr?.code).toBe(Code.FailedPrecondition);
  });

  it("clones a branch, or a commit detached", async () => {
    const other = path.join(remotes, "other");
    sh(other, "checkout", "-b", "dev");
    await writeFile(path.join(other, "dev.txt"), "d\n");
    sh(other, "add", ".");
    sh(other, "commit", "-m", "dev");
    sh(other, "push", "origin", "dev");
    await g.clone({ url: bare, path: "by-branch", branch: "dev" });
    expect((await g.getStatus({ path: "by-branch" })).currentBranch).toBe("dev");
    expect((await g.listBranches({ path: "by-branch" })).branches).toEqual(["dev"]);
    const first = sh(bare, "rev-list", "--max-parents=0", "main").trim();
    await g.clone({ url: bare, path: "by-commit", commitId: first });
    expect((await g.getStatus({ path: "by-commit" })).currentBranch).toBe("HEAD");
    expect(sh(path.join(agent.root, "by-commit"), "rev-parse", "HEAD").trim()).toBe(first);
  });

  it("answers bad input with clear errors", async () => {
    expect((await errOf(g.getStatus({ path: "no-such-repo" })))?.code).toBe(Code.NotFound);
    await mkdir(path.join(agent.root, "plain"));
    const notRepo = await errOf(g.getStatus({ path: "plain" }));
    expect(notRepo?.code).toBe(Code.NotFound);
    expect(notRepo?.rawMessage).toMatch(/not a git repository/);
    expect((await errOf(g.clone({ url: path.join(remotes, "missing.git"), path: "x" })))?.code).toBe(Code.NotFound);
    expect((await errOf(g.clone({ url: bare, path: repo })))?.code).toBe(Code.FailedPrecondition);
    expect((await errOf(g.clone({ url: "", path: "y" })))?.code).toBe(Code.InvalidArgument);
    const relative = await errOf(g.clone({ url: "../some/repo", path: "y" }));
    expect(relative?.code).toBe(Code.InvalidArgument);
    expect(relative?.rawMessage).toMatch(/url must be a URL/);
    // A remote git cannot use (here: a scheme it has no helper for) is the caller's problem, in git's words.
    const unusable = await errOf(g.clone({ url: "nosuchscheme://host/repo", path: "y" }));
    expect(unusable?.code).toBe(Code.InvalidArgument);
    expect(unusable?.rawMessage).toMatch(/nosuchscheme/);
    expect((await errOf(g.add({ path: repo, files: ["does-not-exist.txt"] })))?.code).toBe(Code.NotFound);
    expect((await errOf(g.commit({ path: repo, message: "", author: "A", email: "a@x" })))?.code).toBe(Code.InvalidArgument);
    expect((await g.getHistory({ path: await emptyRepo() })).commits).toEqual([]);
  });
});

async function emptyRepo(): Promise<string> {
  const dir = path.join(agent.root, "empty-repo");
  await mkdir(dir, { recursive: true });
  sh(dir, "init");
  return dir;
}

describe("git over HTTP with basic auth (git http-backend)", () => {
  let server: GitHttpServer;
  let bare: string;
  beforeAll(async () => {
    bare = await makeRemote("secure.git");
    server = await startGitHttpServer(remotes, USER, PASSWORD);
  });
  afterAll(async () => {
    await server?.close();
  });

  it("refuses missing or wrong credentials, and clones, pushes and pulls with the right ones", async () => {
    const url = `${server.url}/secure.git`;
    const none = await errOf(g.clone({ url, path: "h0" }));
    expect(none?.code).toBe(Code.Unauthenticated);
    const wrong = await errOf(g.clone({ url, path: "h1", username: USER, password: "not-the-password" }));
    expect(wrong?.code).toBe(Code.Unauthenticated);
    expect(wrong?.rawMessage).not.toContain("not-the-password");
    await expect(stat(path.join(agent.root, "h1"))).rejects.toThrow();

    await g.clone({ url, path: "h", username: USER, password: PASSWORD });
    expect(await readFile(path.join(agent.root, "h", "README.md"), "utf8")).toBe("# seed\n");
    expect(server.seenAuth).toContain("Basic " + Buffer.from(`${USER}:${PASSWORD}`).toString("base64"));

    await writeFile(path.join(agent.root, "h", "pushed.txt"), "p\n");
    await g.add({ path: "h", files: ["."] });
    const { hash } = await g.commit({ path: "h", message: "over http", author: "A", email: "a@x" });
    expect((await errOf(g.push({ path: "h", username: USER, password: "wrong" })))?.code).toBe(Code.Unauthenticated);
    expect((await errOf(g.push({ path: "h" })))?.code).toBe(Code.Unauthenticated);
    await g.push({ path: "h", username: USER, password: PASSWORD });
    expect(sh(bare, "rev-parse", "main").trim()).toBe(hash);

    const other = path.join(remotes, "secure-other");
    sh(remotes, "clone", bare, other);
    await writeFile(path.join(other, "pulled.txt"), "q\n");
    sh(other, "add", ".");
    sh(other, "commit", "-m", "for pull");
    sh(other, "push", "origin", "main");
    expect((await errOf(g.pull({ path: "h", username: USER, password: "wrong" })))?.code).toBe(Code.Unauthenticated);
    await g.pull({ path: "h", username: USER, password: PASSWORD });
    expect(await readFile(path.join(agent.root, "h", "pulled.txt"), "utf8")).toBe("q\n");
    const status = await g.getStatus({ path: "h" });
    expect(status).toMatchObject({ currentBranch: "main", ahead: 0, behind: 0, branchPublished: true });

    // The password was never written to disk (repository, home, agent state) nor logged.
    const files = [...(await filesBelow(agent.root)), ...(await filesBelow(agent.stateDir))];
    expect(files.some((f) => f.endsWith(path.join("h", ".git", "config")))).toBe(true);
    for (const f of files) {
      const text = await readFile(f, "latin1");
      expect(text.includes(PASSWORD), f).toBe(false);
    }
    expect(await readFile(path.join(agent.root, "h", ".git", "config"), "utf8")).not.toContain(USER + ":");
    expect(agent.output()).not.toContain(PASSWORD);
    expect(agent.output()).not.toContain("not-the-password");
  });
});

