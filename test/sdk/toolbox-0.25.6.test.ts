import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, originScript, PY_MODULE, runLabel, startRealServer, type RealServer } from "./support.ts";

// SDK 0.25.6 on a real sandbox created through its own API: pure HTTP on
// {apiUrl}/toolbox/{id}/toolbox (no WebSocket), relative paths prefixed client-side with
// GET …/project-dir, single-file download by GET …/files/download, log following as a chunked
// HTTP body, session output as plain text without markers, list as GET /sandbox?labels=.

type Sdk = typeof import("sdk-0256");
type Sandbox = import("sdk-0256").Sandbox;
const sdk = load<Sdk>("sdk-0256");

let s: RealServer;
let daytona: import("sdk-0256").Daytona;
let sandbox: Sandbox;
let root: string;
let local: string;
const label = runLabel();

beforeAll(async () => {
  s = await startRealServer();
  local = await mkdtemp(join(tmpdir(), "sandbar-sdk025-"));
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local" });
  sandbox = await daytona.create({ language: "python", labels: { suite: label }, envVars: { PROJECT: "sandbar" }, autoStopInterval: 45 }, { timeout: 120 });
  const dir = await sandbox.getUserRootDir();
  if (!dir) throw new Error("the sandbox reported no root dir");
  root = dir;
}, 600_000);
afterAll(async () => {
  await s?.stop();
  if (local) await rm(local, { recursive: true, force: true });
});

describe("SDK 0.25.6 on a real sandbox", () => {
  it("create, get, list by labels (bare array), setLabels, intervals, preview link", async () => {
    expect(sandbox.state).toBe("started");
    expect(sandbox.labels).toMatchObject({ suite: label, "code-toolbox-language": "python" });
    expect(sandbox.autoStopInterval).toBe(45);
    expect((await daytona.get(sandbox.id)).env).toMatchObject({ PROJECT: "sandbar" });
    expect((await daytona.list({ suite: label })).map((x) => x.id)).toEqual([sandbox.id]);
    expect(await daytona.list({ suite: "nobody" })).toEqual([]);
    expect((await daytona.findOne({ labels: { suite: label } })).id).toBe(sandbox.id);

    expect(await sandbox.setLabels({ suite: label, tier: "old" })).toMatchObject({ suite: label, tier: "old" });
    expect((await daytona.list({ tier: "old" })).map((x) => x.id)).toEqual([sandbox.id]);

    await sandbox.setAutostopInterval(0);
    await sandbox.setAutoArchiveInterval(120);
    await sandbox.setAutoDeleteInterval(-1);
    await sandbox.refreshData();
    expect({ stop: sandbox.autoStopInterval, archive: sandbox.autoArchiveInterval, del: sandbox.autoDeleteInterval }).toEqual({ stop: 0, archive: 120, del: -1 });
    const preview = await sandbox.getPreviewLink(3000);
    expect(preview.url).toMatch(/^https?:\/\//);
    expect(preview.token).toBeTruthy();
  });

  it("reads the root dir (project-dir) and resolves relative paths against it", async () => {
    expect(root).toMatch(/^\//);
    await sandbox.fs.uploadFile(Buffer.from("relative\n"), "rel/r.txt");
    expect((await sandbox.fs.downloadFile(`${root}/rel/r.txt`)).toString()).toBe("relative\n");
    expect((await sandbox.process.executeCommand(`cat ${root}/rel/r.txt`)).result).toBe("relative\n");
  });

  it("file system: byte-exact uploads (incl. empty, from disk), raw downloads, list, info, find, search, replace, move, permissions, folders", async () => {
    const fs = sandbox.fs;
    const base = `${root}/fs025`;
    await fs.createFolder(base, "750");
    expect(await fs.getFileDetails(base)).toMatchObject({ isDir: true, permissions: "0750" });
    const data = randomBytes(300_000);
    const src = join(local, "local-025.txt");
    await writeFile(src, "disk\nTODO: here\n");
    await fs.uploadFiles([
      { source: data, destination: `${base}/bin.dat` },
      { source: Buffer.alloc(0), destination: `${base}/empty.txt` },
      { source: src, destination: `${base}/sub/disk.txt` },
    ]);
    expect(Buffer.compare(await fs.downloadFile(`${base}/bin.dat`), data)).toBe(0);
    expect((await fs.downloadFile(`${base}/empty.txt`)).length).toBe(0);
    expect((await sandbox.process.executeCommand(`sha256sum < ${base}/bin.dat`)).result.slice(0, 64)).toBe(createHash("sha256").update(data).digest("hex"));
    const out = join(local, "out-025.dat");
    await fs.downloadFile(`${base}/bin.dat`, out);
    expect(Buffer.compare(await readFile(out), data)).toBe(0);
    await expect(fs.downloadFile(`${base}/missing`)).rejects.toThrow();

    expect(await fs.getFileDetails(`${base}/sub/disk.txt`)).toMatchObject({ name: "disk.txt", isDir: false, size: 16 });
    expect((await fs.listFiles(base)).map((f) => f.name).sort()).toEqual(["bin.dat", "empty.txt", "sub"]);
    expect(await fs.findFiles(base, "TODO")).toEqual([{ file: `${base}/sub/disk.txt`, line: 2, content: "TODO: here" }]);
    expect((await fs.searchFiles(base, "*.txt")).files.sort()).toEqual([`${base}/empty.txt`, `${base}/sub/disk.txt`]);
    await fs.replaceInFiles([`${base}/sub/disk.txt`], "disk", "DISK");
    await fs.moveFiles(`${base}/sub/disk.txt`, `${base}/moved.txt`);
    expect((await fs.downloadFile(`${base}/moved.txt`)).toString()).toBe("DISK\nTODO: here\n");
    await fs.setFilePermissions(`${base}/moved.txt`, { mode: "640" });
    expect((await fs.getFileDetails(`${base}/moved.txt`)).permissions).toBe("0640");
    await fs.deleteFile(`${base}/moved.txt`);
    await expect(fs.getFileDetails(`${base}/moved.txt`)).rejects.toThrow();
    // 0.25.6 sends no `recursive`: the daemon of its time deleted a directory whole, and so does the server for it.
    await fs.createFolder(`${base}/sub/deeper`, "755");
    await fs.uploadFile(Buffer.from("in a tree\n"), `${base}/sub/deeper/leaf.txt`);
    await fs.deleteFile(`${base}/sub`);
    await expect(fs.getFileDetails(`${base}/sub`)).rejects.toThrow();
    expect((await fs.listFiles(base)).map((f) => f.name).sort()).toEqual(["bin.dat", "empty.txt"]);
  });

  it("process: executeCommand with cwd (default: the root dir), tricky env values, timeout; codeRun (python)", async () => {
    const env = { QUOTES: `it's "q"`, DOLLARS: "$HOME $(echo no) `no`" };
    const res = await sandbox.process.executeCommand('printf "%s|%s|%s" "$QUOTES" "$DOLLARS" "$(pwd)"', undefined, env);
    expect(res).toMatchObject({ exitCode: 0, result: `${env.QUOTES}|${env.DOLLARS}|${root}` });
    expect((await sandbox.process.executeCommand("pwd", "/tmp")).result).toBe("/tmp\n");
    expect((await sandbox.process.executeCommand("exit 3")).exitCode).toBe(3);
    await expect(sandbox.process.executeCommand("sleep 5", undefined, undefined, 1)).rejects.toThrow(/timeout/);
    expect(await sandbox.process.codeRun("import os\nprint(6 * 7, os.environ['PROJECT'])")).toMatchObject({ exitCode: 0, result: "42 sandbar\n" });
  });

  it("sessions: plain combined output, async exec, logs plain and followed over chunked HTTP", async () => {
    const p = sandbox.process;
    await p.createSession("s025");
    const sync = await p.executeSessionCommand("s025", { command: "echo out; echo err >&2" });
    expect(sync.exitCode).toBe(0);
    expect(sync.output!.split("\n").sort()).toEqual(["", "err", "out"]);

    const started = await p.executeSessionCommand("s025", { command: "for i in 1 2 3; do echo line$i; sleep 0.2; done", async: true });
    let followed = "";
    await p.getSessionCommandLogs("s025", started.cmdId!, (chunk: string) => (followed += chunk));
    expect(followed).toBe("line1\nline2\nline3\n");
    expect((await p.getSessionCommand("s025", started.cmdId!)).exitCode).toBe(0);
    expect(await p.getSessionCommandLogs("s025", started.cmdId!)).toBe("line1\nline2\nline3\n");
    expect((await p.listSessions()).map((x) => x.sessionId)).toContain("s025");
    await p.deleteSession("s025");
    await expect(p.getSession("s025")).rejects.toThrow();
  });

  it("git: clone (relative path) from a bare repository in the sandbox, status, add, commit, push, pull, branches", async () => {
    const origin = `${root}/origin025.git`;
    expect((await sandbox.process.executeCommand(originScript(origin))).result).toContain("ok");
    await sandbox.git.clone(`file://${origin}`, "repo025");
    await sandbox.fs.uploadFile(Buffer.from("x\n"), "repo025/x.txt");
    expect((await sandbox.git.status("repo025")).fileStatus.map((f) => f.name)).toEqual(["x.txt"]);
    await sandbox.git.add("repo025", ["x.txt"]);
    await sandbox.git.commit("repo025", "x", "Tester", "tester@example.com");
    await sandbox.git.push("repo025");
    const head = (await sandbox.process.executeCommand(`git -C ${root}/repo025 rev-parse HEAD`)).result.trim();
    expect((await sandbox.process.executeCommand(`git --git-dir=${origin} rev-parse main`)).result.trim()).toBe(head);
    const script = `set -e; git clone -q ${origin} ${root}/other025; cd ${root}/other025; echo o > o.txt; git add o.txt; git -c user.name=o -c user.email=o@example.com commit -q -m other; git push -q origin main; echo ok`;
    expect((await sandbox.process.executeCommand(script)).result).toContain("ok");
    await sandbox.git.pull("repo025");
    expect((await sandbox.fs.downloadFile("repo025/o.txt")).toString()).toBe("o\n");
    expect((await sandbox.git.branches("repo025")).branches).toEqual(["main"]);
  });

  it("LSP (python): document symbols, workspace symbols", async () => {
    await sandbox.fs.uploadFile(Buffer.from(PY_MODULE), "py025/mod.py");
    const lsp = await sandbox.createLspServer("python", "py025");
    await lsp.start();
    await lsp.didOpen("mod.py");
    expect((await lsp.documentSymbols("mod.py")).map((x) => x.name)).toEqual(expect.arrayContaining(["WidgetFactory", "make_widget"]));
    // pylsp has no workspace/symbol: the agent's index of the project answers.
    const ws = await lsp.workspaceSymbols("widget");
    expect(ws.map((x) => x.name).sort()).toEqual(["WidgetFactory", "make_widget"]);
    expect(ws.find((x) => x.name === "WidgetFactory")).toMatchObject({ kind: 5, location: { uri: `file://${root}/py025/mod.py`, range: { start: { line: 0 } } } });
    await lsp.stop();
  });

  it("LSP (typescript): completions, document symbols, workspace symbols under the workspace-symbols spelling", async () => {
    await sandbox.fs.uploadFiles([
      { source: Buffer.from("{}"), destination: "ts025/tsconfig.json" },
      { source: Buffer.from("export class OldClientThing {}\nexport const oldValue = new OldClientThing();\noldV"), destination: "ts025/index.ts" },
    ]);
    const lsp = await sandbox.createLspServer("typescript", "ts025");
    await lsp.start();
    await lsp.didOpen("index.ts"); // relative to the project in this client
    expect((await lsp.completions("index.ts", { line: 2, character: 4 })).items.map((i) => i.label)).toContain("oldValue");
    expect((await lsp.documentSymbols("index.ts")).map((x) => x.name)).toEqual(expect.arrayContaining(["OldClientThing", "oldValue"]));
    expect((await lsp.workspaceSymbols("OldClientThing")).map((x) => x.name)).toContain("OldClientThing");
    await lsp.stop();
  });

  it("stop, start, archive, start again (files survive)", async () => {
    await sandbox.fs.uploadFile(Buffer.from("kept\n"), "kept.txt");
    await sandbox.stop();
    expect(sandbox.state).toBe("stopped");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile("kept.txt")).toString()).toBe("kept\n");
    await sandbox.stop();
    await sandbox.archive();
    expect(sandbox.state).toBe("archived");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile(`${root}/kept.txt`)).toString()).toBe("kept\n");
  }, 300_000);

  it("sandbox.delete() resolves: its read right after the delete sees the sandbox destroyed, and lists no longer show it", async () => {
    const other = await daytona.create({ language: "python", labels: { suite: `${label}-del` } }, { timeout: 120 });
    await other.delete();
    expect(other.state).toBe("destroyed");
    expect(await daytona.list({ suite: `${label}-del` })).toEqual([]);
  }, 180_000);

  it("delete: DELETE /sandbox/{id}?force=true (what sandbox.delete() sends, through the SDK's API client) removes it", async () => {
    // The SDK's API client is a private field its declarations leave untyped: typed here as far as the test uses it.
    const api: { deleteSandbox(id: string, force: boolean): Promise<unknown> } = daytona["sandboxApi"];
    await api.deleteSandbox(sandbox.id, true);
    // Read by id during the grace period: destroyed (the reference's answer), then 404.
    expect((await daytona.get(sandbox.id)).state).toBe("destroyed");
    expect(await daytona.list({ suite: label })).toEqual([]);
  });
});
