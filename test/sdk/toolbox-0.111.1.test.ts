import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { followLogsOverGrpc, load, originScript, PY_MODULE, runLabel, startRealServer, type RealServer } from "./support.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";

// SDK 0.111.1 on a real sandbox created through its own API: toolbox calls go to
// {apiUrl}/toolbox/{id}/toolbox; log following uses a WebSocket to the preview URL of port 2280.

type Sdk = typeof import("sdk-0111");
type Sandbox = import("sdk-0111").Sandbox;
const sdk = load<Sdk>("sdk-0111");
const { DaytonaNotFoundError } = load<{ DaytonaNotFoundError: new () => Error }>("sdk-0111/src/errors/DaytonaError");

let s: RealServer;
let daytona: import("sdk-0111").Daytona;
let sandbox: Sandbox;
let home: string;
let local: string;
const label = runLabel();

beforeAll(async () => {
  s = await startRealServer();
  local = await mkdtemp(join(tmpdir(), "sandbar-sdk111-"));
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local" });
  sandbox = await daytona.create({ language: "python", labels: { suite: label }, envVars: { PROJECT: "sandbar" }, autoStopInterval: 30 }, { timeout: 120 });
  const dir = await sandbox.getUserHomeDir();
  if (!dir) throw new Error("the sandbox reported no home dir");
  home = dir;
}, 600_000);
afterAll(async () => {
  await s?.stop();
  if (local) await rm(local, { recursive: true, force: true });
});

describe("SDK 0.111.1 on a real sandbox", () => {
  it("create, get, list by labels (paginated), setLabels, intervals, preview link", async () => {
    expect(sandbox.state).toBe("started");
    expect(sandbox.labels).toMatchObject({ suite: label, "code-toolbox-language": "python" });
    expect(sandbox.autoStopInterval).toBe(30);
    const got = await daytona.get(sandbox.id);
    expect(got.id).toBe(sandbox.id);
    expect(got.env).toMatchObject({ PROJECT: "sandbar" });
    const listed = await daytona.list({ suite: label });
    expect(listed.items.map((x) => x.id)).toEqual([sandbox.id]);
    expect(listed).toMatchObject({ total: 1, page: 1, totalPages: 1 });
    expect((await daytona.list({ suite: "nobody" })).items).toEqual([]);

    const labels = await sandbox.setLabels({ suite: label, extra: "yes" });
    expect(labels).toMatchObject({ suite: label, extra: "yes" });
    expect((await daytona.list({ extra: "yes", suite: label })).items.map((x) => x.id)).toEqual([sandbox.id]);

    await sandbox.setAutostopInterval(0);
    await sandbox.setAutoArchiveInterval(60);
    await sandbox.setAutoDeleteInterval(-1);
    await sandbox.refreshData();
    expect({ stop: sandbox.autoStopInterval, archive: sandbox.autoArchiveInterval, del: sandbox.autoDeleteInterval }).toEqual({ stop: 0, archive: 60, del: -1 });

    const preview = await sandbox.getPreviewLink(8080);
    expect(preview.url).toMatch(/^https?:\/\//);
    expect(preview.token).toBeTruthy();
  });

  it("reads the user's home and work dirs", async () => {
    expect(home).toMatch(/^\//);
    expect(await sandbox.getWorkDir()).toMatch(/^\//);
  });

  it("file system: byte-exact uploads and downloads (incl. empty), list, info, find, search, replace, move, permissions, folders", async () => {
    const fs = sandbox.fs;
    const base = `${home}/fs111`;
    await fs.createFolder(base, "755");
    expect(await fs.getFileDetails(base)).toMatchObject({ name: "fs111", isDir: true, permissions: "0755" });
    const data = randomBytes(200_000);
    await fs.uploadFile(data, `${base}/bin.dat`);
    const src = join(local, "local-src.txt");
    await writeFile(src, "from disk\nTODO: find me\n");
    await fs.uploadFiles([
      { source: Buffer.from("hello world\n"), destination: `${base}/a.txt` },
      { source: Buffer.alloc(0), destination: `${base}/empty.txt` },
      { source: src, destination: `${base}/sub/disk.txt` },
    ]);
    expect(Buffer.compare(await fs.downloadFile(`${base}/bin.dat`), data)).toBe(0);
    expect((await fs.downloadFile(`${base}/empty.txt`)).length).toBe(0);
    // The bytes really are inside the sandbox.
    expect((await sandbox.process.executeCommand(`sha256sum < ${base}/bin.dat`)).result.slice(0, 64)).toBe((await import("node:crypto")).createHash("sha256").update(data).digest("hex"));

    const results = await fs.downloadFiles([{ source: `${base}/a.txt` }, { source: `${base}/missing.txt` }, { source: `${base}/sub/disk.txt`, destination: join(local, "out", "disk.txt") }]);
    expect(results[0].result?.toString()).toBe("hello world\n");
    expect(results[1].error).toBeTruthy();
    expect(results[2].error).toBeUndefined();
    expect(await readFile(join(local, "out", "disk.txt"), "utf8")).toBe("from disk\nTODO: find me\n");
    await expect(fs.downloadFile(`${base}/missing.txt`)).rejects.toThrow();

    expect(await fs.getFileDetails(`${base}/a.txt`)).toMatchObject({ name: "a.txt", isDir: false, size: 12 });
    expect((await fs.listFiles(base)).map((f) => f.name).sort()).toEqual(["a.txt", "bin.dat", "empty.txt", "sub"]);
    expect(await fs.findFiles(base, "TODO")).toEqual([{ file: `${base}/sub/disk.txt`, line: 2, content: "TODO: find me" }]);
    expect((await fs.searchFiles(base, "*.txt")).files.sort()).toEqual([`${base}/a.txt`, `${base}/empty.txt`, `${base}/sub/disk.txt`]);
    expect(await fs.replaceInFiles([`${base}/a.txt`], "world", "sandbar")).toEqual([expect.objectContaining({ file: `${base}/a.txt`, success: true })]);
    await fs.moveFiles(`${base}/a.txt`, `${base}/b.txt`);
    expect((await fs.downloadFile(`${base}/b.txt`)).toString()).toBe("hello sandbar\n");
    await fs.setFilePermissions(`${base}/b.txt`, { mode: "600" });
    expect((await fs.getFileDetails(`${base}/b.txt`)).permissions).toBe("0600");
    await expect(fs.getFileDetails(`${base}/nope`)).rejects.toBeInstanceOf(DaytonaNotFoundError);
    await fs.deleteFile(base, true);
    await expect(fs.getFileDetails(base)).rejects.toBeInstanceOf(DaytonaNotFoundError);
  });

  it("process: executeCommand with cwd, tricky env values, exit codes, timeout; codeRun (python)", async () => {
    const env = { QUOTES: `it's "q"`, DOLLARS: "$HOME $(echo no) `no`" };
    const res = await sandbox.process.executeCommand('printf "%s|%s|%s" "$QUOTES" "$DOLLARS" "$(pwd)"', "/tmp", env);
    expect(res).toMatchObject({ exitCode: 0, result: `${env.QUOTES}|${env.DOLLARS}|/tmp` });
    expect((await sandbox.process.executeCommand("exit 4")).exitCode).toBe(4);
    await expect(sandbox.process.executeCommand("sleep 5", undefined, undefined, 1)).rejects.toThrow(/timeout/);
    const code = await sandbox.process.codeRun('import sys\nprint("py", sys.argv[1:])', { argv: ["x", "y"] });
    expect(code).toMatchObject({ exitCode: 0, result: "py ['x', 'y']\n" });
  });

  it("sessions: sync and async exec with stdout/stderr apart, plain logs", async () => {
    const p = sandbox.process;
    await p.createSession("s111");
    await p.executeSessionCommand("s111", { command: "export WHO=sandbar" });
    const sync = await p.executeSessionCommand("s111", { command: 'echo "hi $WHO"; echo oops >&2; (exit 2)' });
    expect(sync).toMatchObject({ exitCode: 2, stdout: "hi sandbar\n", stderr: "oops\n" });

    const started = await p.executeSessionCommand("s111", { command: "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done", runAsync: true });
    expect(started.cmdId).toBeTruthy();
    // While running the server answers `exitCode: null` (the reference leaves it out).
    await eventually("the async command to end", async () => (await p.getSessionCommand("s111", started.cmdId!)).exitCode != null);
    expect((await p.getSessionCommand("s111", started.cmdId!)).exitCode).toBe(0);
    const logs = await p.getSessionCommandLogs("s111", started.cmdId!);
    expect({ stdout: logs.stdout, stderr: logs.stderr }).toEqual({ stdout: "o1\no2\no3\n", stderr: "e1\ne2\ne3\n" });
    expect((await p.getSession("s111")).commands).toHaveLength(3);
    expect((await p.listSessions()).map((x) => x.sessionId)).toContain("s111");
  });

  it("the preview URL of port 2280 is the toolbox base on the API (what log following connects to)", async () => {
    const preview = await sandbox.getPreviewLink(2280);
    expect(preview.url).toBe(`${s.apiUrl}/toolbox/${sandbox.id}/toolbox`);
  });

  it("sessions: logs followed over WebSocket (via the 2280 preview URL), stdout and stderr apart", async () => {
    const p = sandbox.process;
    const started = await p.executeSessionCommand("s111", { command: "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done", runAsync: true });
    let stdout = "";
    let stderr = "";
    await p.getSessionCommandLogs("s111", started.cmdId!, (c) => (stdout += c), (c) => (stderr += c));
    expect({ stdout, stderr }).toEqual({ stdout: "o1\no2\no3\n", stderr: "e1\ne2\ne3\n" });
  });

  it("PTY: create, connect over WebSocket (via the 2280 preview URL), input, output, exit code", async () => {
    let output = "";
    const decoder = new TextDecoder();
    const pty = await sandbox.process.createPty({ id: "pty111", cwd: home, envs: { GREETING: "hey" }, cols: 100, rows: 30, onData: (d: Uint8Array) => void (output += decoder.decode(d, { stream: true })) });
    await pty.sendInput('echo "$GREETING $((6*7))"\n');
    await eventually("the greeting", () => output.includes("hey 42"));
    expect(output).toContain("hey 42");
    await pty.sendInput("exit 5\n");
    expect((await pty.wait()).exitCode).toBe(5);
  });

  it("gRPC (@grpc/grpc-js): follows a session command's logs as a server stream on the control port", async () => {
    const p = sandbox.process;
    const started = await p.executeSessionCommand("s111", { command: "for i in 1 2 3; do echo g$i; echo x$i >&2; sleep 0.2; done", runAsync: true });
    expect(await followLogsOverGrpc(s, sandbox.id, "s111", started.cmdId!)).toEqual({ stdout: "g1\ng2\ng3\n", stderr: "x1\nx2\nx3\n" });
    await p.deleteSession("s111");
    await expect(p.getSession("s111")).rejects.toThrow();
  });

  it("git: clone from a bare repository in the sandbox, branches, status, add, commit, push, pull", async () => {
    const origin = `${home}/origin111.git`;
    expect((await sandbox.process.executeCommand(originScript(origin))).result).toContain("ok");
    const repo = `${home}/repo111`;
    await sandbox.git.clone(`file://${origin}`, repo);
    expect((await sandbox.fs.downloadFile(`${repo}/seed.txt`)).toString()).toBe("seed\n");
    expect((await sandbox.git.branches(repo)).branches).toEqual(["main"]);
    await sandbox.git.createBranch(repo, "feature");
    await sandbox.git.checkoutBranch(repo, "feature");
    await sandbox.fs.uploadFile(Buffer.from("new\n"), `${repo}/new.txt`);
    const status = await sandbox.git.status(repo);
    expect(status.currentBranch).toBe("feature");
    expect(status.fileStatus).toEqual([expect.objectContaining({ name: "new.txt" })]);
    await sandbox.git.add(repo, ["new.txt"]);
    const commit = await sandbox.git.commit(repo, "add new", "Tester", "tester@example.com");
    expect(commit.sha).toMatch(/^[0-9a-f]{40}$/);
    await sandbox.git.checkoutBranch(repo, "main");
    await sandbox.git.deleteBranch(repo, "feature");
    expect((await sandbox.git.branches(repo)).branches).toEqual(["main"]);
    await sandbox.fs.uploadFile(Buffer.from("main\n"), `${repo}/main.txt`);
    await sandbox.git.add(repo, ["main.txt"]);
    const pushed = await sandbox.git.commit(repo, "on main", "Tester", "tester@example.com");
    await sandbox.git.push(repo);
    expect((await sandbox.process.executeCommand(`git --git-dir=${origin} rev-parse main`)).result.trim()).toBe(pushed.sha);
    // Someone else pushes; pull brings it in.
    const other = `${home}/other111`;
    const script = `set -e; git clone -q ${origin} ${other}; cd ${other}; echo o > o.txt; git add o.txt; git -c user.name=o -c user.email=o@example.com commit -q -m other; git push -q origin main; echo ok`;
    expect((await sandbox.process.executeCommand(script)).result).toContain("ok");
    await sandbox.git.pull(repo);
    expect((await sandbox.fs.downloadFile(`${repo}/o.txt`)).toString()).toBe("o\n");
    expect((await sandbox.git.status(repo)).ahead).toBe(0);
  });

  it("LSP (python, pylsp in the snapshot): completions and document symbols", async () => {
    const project = `${home}/py111`;
    await sandbox.fs.createFolder(project, "755");
    await sandbox.fs.uploadFile(Buffer.from(PY_MODULE), `${project}/mod.py`);
    const lsp = await sandbox.createLspServer("python", project);
    await lsp.start();
    await lsp.didOpen(`${project}/mod.py`);
    const completions = await lsp.completions(`${project}/mod.py`, { line: 8, character: 6 });
    expect(completions.items.map((i) => i.label).join(" ")).toContain("make_widget");
    expect((await lsp.documentSymbols(`${project}/mod.py`)).map((x) => x.name)).toEqual(expect.arrayContaining(["WidgetFactory", "make_widget"]));
    await lsp.didClose(`${project}/mod.py`);
    await lsp.stop();
  });

  it("LSP (typescript, the agent bundle's typescript-language-server): completions, document and sandbox symbols", async () => {
    const project = `${home}/ts111`;
    await sandbox.fs.uploadFiles([
      { source: Buffer.from("{}"), destination: `${project}/tsconfig.json` },
      { source: Buffer.from("export class WidgetFactory {}\nexport function makeWidget() { return new WidgetFactory(); }\nmakeW"), destination: `${project}/index.ts` },
    ]);
    const lsp = await sandbox.createLspServer("typescript", project);
    await lsp.start();
    await lsp.didOpen(`${project}/index.ts`);
    const completions = await lsp.completions(`${project}/index.ts`, { line: 2, character: 5 });
    expect(completions.items.map((i) => i.label)).toContain("makeWidget");
    expect((await lsp.documentSymbols(`${project}/index.ts`)).map((x) => x.name)).toEqual(expect.arrayContaining(["WidgetFactory", "makeWidget"]));
    expect((await lsp.sandboxSymbols("WidgetFactory")).map((x) => x.name)).toContain("WidgetFactory");
    await lsp.stop();
  });

  it("stop, start, archive, start again (files survive), delete", async () => {
    await sandbox.fs.uploadFile(Buffer.from("kept\n"), `${home}/kept.txt`);
    await sandbox.stop();
    expect(sandbox.state).toBe("stopped");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile(`${home}/kept.txt`)).toString()).toBe("kept\n");
    await sandbox.stop();
    await sandbox.archive();
    await sandbox.refreshData();
    expect(sandbox.state).toBe("archived");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile(`${home}/kept.txt`)).toString()).toBe("kept\n");
    await sandbox.delete();
    await eventually("the sandbox to be destroyed", async () => /destroyed|gone/.test(await daytona.get(sandbox.id).then((x) => String(x.state), () => "gone")));
    expect(await daytona.get(sandbox.id).then((x) => x.state, () => "gone")).toMatch(/destroyed|gone/);
    expect((await daytona.list({ suite: label })).items.filter((x) => x.state !== "destroyed")).toEqual([]);
  }, 300_000);
});
