import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, originScript, PY_MODULE, runLabel, startRealServer, type RealServer } from "./support.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";

// SDK 0.218.0 (current) on a real sandbox created through its own API: the toolbox at the DTO's
// toolboxProxyUrl + "/{id}" (no /toolbox segment), raw commands with envs, process/code-run,
// server-split stdout/stderr and JSON logs, WebSockets straight to the toolbox proxy URL, the
// cursor list `GET /sandbox?cursor=&limit=&labels=` answering {items, nextCursor}.

type Sdk = typeof import("sdk-0218");
type Sandbox = import("sdk-0218").Sandbox;
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let daytona: import("sdk-0218").Daytona;
let sandbox: Sandbox;
let home: string;
let local: string;
const label = runLabel();

/** Everything an async generator yields. */
async function all<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

beforeAll(async () => {
  s = await startRealServer();
  local = await mkdtemp(join(tmpdir(), "sandbar-sdk218-"));
  // Polling for state changes (the Socket.IO event stream is not served).
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
  sandbox = await daytona.create({ language: "python", labels: { suite: label }, envVars: { PROJECT: "sandbar" }, autoStopInterval: 20, autoArchiveInterval: 90, autoDeleteInterval: -1 }, { timeout: 120 });
  const dir = await sandbox.getUserHomeDir();
  if (!dir) throw new Error("the sandbox reported no home dir");
  home = dir;
}, 600_000);
afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
  if (local) await rm(local, { recursive: true, force: true });
});

describe("SDK 0.218.0 on a real sandbox", () => {
  it("create, get, setLabels, intervals, preview link", async () => {
    expect(sandbox.state).toBe("started");
    expect(sandbox.labels).toMatchObject({ suite: label, "code-toolbox-language": "python" });
    expect({ stop: sandbox.autoStopInterval, archive: sandbox.autoArchiveInterval, del: sandbox.autoDeleteInterval }).toEqual({ stop: 20, archive: 90, del: -1 });
    expect(sandbox.toolboxProxyUrl).toBe(`${s.apiUrl}/toolbox-proxy`);
    const got = await daytona.get(sandbox.id);
    expect(got.env).toMatchObject({ PROJECT: "sandbar" });
    expect(await got.getWorkDir()).toMatch(/^\//);

    expect(await sandbox.setLabels({ suite: label, gen: "218" })).toMatchObject({ suite: label, gen: "218" });
    await sandbox.setAutostopInterval(0);
    await sandbox.setAutoArchiveInterval(30);
    await sandbox.setAutoDeleteInterval(120);
    await sandbox.refreshData();
    expect({ stop: sandbox.autoStopInterval, archive: sandbox.autoArchiveInterval, del: sandbox.autoDeleteInterval }).toEqual({ stop: 0, archive: 30, del: 120 });
    await sandbox.setAutoDeleteInterval(-1);
    const preview = await sandbox.getPreviewLink(5173);
    expect(preview.url).toMatch(/^https?:\/\//);
    expect(preview.token).toBeTruthy();
  });

  it("list by labels through the cursor list (async generator)", async () => {
    expect((await all(daytona.list({ labels: { suite: label } }))).map((x) => x.id)).toEqual([sandbox.id]);
    expect((await all(daytona.list({ labels: { suite: label, gen: "218" }, limit: 1 }))).map((x) => x.id)).toEqual([sandbox.id]);
    expect(await all(daytona.list({ labels: { suite: "nobody" } }))).toEqual([]);
  });

  it("file system: byte-exact uploads (buffer, empty, stream) and downloads (buffer, file, stream), errors, list, info, find, search, replace, move, permissions, folders", async () => {
    const fs = sandbox.fs;
    const base = `${home}/fs218`;
    await fs.createFolder(base, "700");
    expect(await fs.getFileDetails(base)).toMatchObject({ isDir: true, permissions: "0700" });
    const data = randomBytes(500_000);
    await fs.uploadFiles([
      { source: data, destination: `${base}/bin.dat` },
      { source: Buffer.alloc(0), destination: `${base}/empty.txt` },
      { source: Buffer.from("alpha\nTODO beta\n"), destination: `${base}/sub/a.txt` },
    ]);
    await fs.uploadFileStream(Readable.from([Buffer.from("streamed "), Buffer.from("upload")]), `${base}/streamed.txt`);
    expect((await sandbox.process.executeCommand(`cat ${base}/streamed.txt`)).result).toBe("streamed upload");
    expect(Buffer.compare(await fs.downloadFile(`${base}/bin.dat`), data)).toBe(0);
    expect((await sandbox.process.executeCommand(`sha256sum < ${base}/bin.dat`)).result.slice(0, 64)).toBe(createHash("sha256").update(data).digest("hex"));
    expect((await fs.downloadFile(`${base}/empty.txt`)).length).toBe(0);
    const out = join(local, "out-218.dat");
    await fs.downloadFile(`${base}/bin.dat`, out);
    expect(Buffer.compare(await readFile(out), data)).toBe(0);
    const stream = await fs.downloadFileStream(`${base}/sub/a.txt`);
    const chunks: Buffer[] = [];
    for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
    expect(Buffer.concat(chunks).toString()).toBe("alpha\nTODO beta\n");

    const results = await fs.downloadFiles([{ source: `${base}/sub/a.txt` }, { source: `${base}/missing.txt` }]);
    expect(results[0].result?.toString()).toBe("alpha\nTODO beta\n");
    expect(results[1].error).toBeTruthy();
    await expect(fs.downloadFile(`${base}/missing.txt`)).rejects.toBeInstanceOf(sdk.DaytonaNotFoundError);

    expect(await fs.getFileDetails(`${base}/sub/a.txt`)).toMatchObject({ name: "a.txt", isDir: false, size: 16 });
    expect((await fs.listFiles(base)).map((f) => f.name).sort()).toEqual(["bin.dat", "empty.txt", "streamed.txt", "sub"]);
    expect(await fs.findFiles(base, "TODO")).toEqual([{ file: `${base}/sub/a.txt`, line: 2, content: "TODO beta" }]);
    expect((await fs.searchFiles(base, "*.txt")).files.sort()).toEqual([`${base}/empty.txt`, `${base}/streamed.txt`, `${base}/sub/a.txt`]);
    await fs.replaceInFiles([`${base}/sub/a.txt`], "alpha", "ALPHA");
    await fs.moveFiles(`${base}/sub/a.txt`, `${base}/b.txt`);
    expect((await fs.downloadFile(`${base}/b.txt`)).toString()).toBe("ALPHA\nTODO beta\n");
    await fs.setFilePermissions(`${base}/b.txt`, { mode: "600" });
    expect((await fs.getFileDetails(`${base}/b.txt`)).permissions).toBe("0600");
    await expect(fs.getFileDetails(`${base}/nope`)).rejects.toBeInstanceOf(sdk.DaytonaNotFoundError);
    await fs.deleteFile(base, true);
    await expect(fs.getFileDetails(base)).rejects.toBeInstanceOf(sdk.DaytonaNotFoundError);
  });

  it("process: raw commands with cwd, envs (quotes and $ survive), exit code, timeout; codeRun (python)", async () => {
    const env = { QUOTES: `it's "q"`, DOLLARS: "$HOME $(echo no) `no`" };
    const res = await sandbox.process.executeCommand('printf "%s|%s|%s" "$QUOTES" "$DOLLARS" "$(pwd)"', "/tmp", env);
    expect(res).toMatchObject({ exitCode: 0, result: `${env.QUOTES}|${env.DOLLARS}|/tmp` });
    expect((await sandbox.process.executeCommand("exit 6")).exitCode).toBe(6);
    await expect(sandbox.process.executeCommand("sleep 5", undefined, undefined, 1)).rejects.toThrow(/timeout/i);
    const code = await sandbox.process.codeRun('import sys, os\nprint("py", sys.argv[1:], os.environ["PROJECT"])', { argv: ["x"] });
    expect(code).toMatchObject({ exitCode: 0, result: "py ['x'] sandbar\n" });
  });

  it("sessions: server-split output, async exec with input, JSON logs, logs followed over WebSocket", async () => {
    const p = sandbox.process;
    await p.createSession("s218");
    const sync = await p.executeSessionCommand("s218", { command: "echo out; echo err >&2; (exit 3)" });
    expect(sync).toMatchObject({ exitCode: 3, stdout: "out\n", stderr: "err\n" });

    const reader = await p.executeSessionCommand("s218", { command: 'read line; echo "got $line"', runAsync: true });
    await p.sendSessionCommandInput("s218", reader.cmdId!, "hello");
    let stdout = "";
    let stderr = "";
    await p.getSessionCommandLogs("s218", reader.cmdId!, (c) => (stdout += c), (c) => (stderr += c));
    expect(stdout).toContain("got hello");
    expect(stderr).toBe("");

    const started = await p.executeSessionCommand("s218", { command: "for i in 1 2; do echo o$i; echo e$i >&2; sleep 0.2; done", runAsync: true });
    stdout = "";
    await p.getSessionCommandLogs("s218", started.cmdId!, (c) => (stdout += c), (c) => (stderr += c));
    expect({ stdout, stderr }).toEqual({ stdout: "o1\no2\n", stderr: "e1\ne2\n" });
    const logs = await p.getSessionCommandLogs("s218", started.cmdId!);
    expect({ stdout: logs.stdout, stderr: logs.stderr }).toEqual({ stdout: "o1\no2\n", stderr: "e1\ne2\n" });
    expect((await p.getSessionCommand("s218", started.cmdId!)).exitCode).toBe(0);
    expect((await p.getSession("s218")).commands?.length).toBe(3);
    await p.deleteSession("s218");
    await expect(p.getSession("s218")).rejects.toThrow();
  });

  it("PTY: create, input, output, resize, exit code", async () => {
    let output = "";
    const decoder = new TextDecoder();
    const pty = await sandbox.process.createPty({ id: "pty218", cwd: home, envs: { GREETING: "hey" }, cols: 90, rows: 20, onData: (d: Uint8Array) => void (output += decoder.decode(d, { stream: true })) });
    await pty.resize(100, 33);
    await pty.sendInput('stty size; echo "$GREETING done-$((2+2))"\n');
    await eventually("the greeting", () => output.includes("hey done-4"));
    expect(output).toContain("33 100");
    expect(output).toContain("hey done-4");
    expect((await sandbox.process.listPtySessions()).map((x) => x.id)).toContain("pty218");
    await pty.sendInput("exit 5\n");
    expect((await pty.wait()).exitCode).toBe(5);
  });

  it("git: clone from a bare repository in the sandbox, branch, status, add, commit, push, pull", async () => {
    const origin = `${home}/origin218.git`;
    expect((await sandbox.process.executeCommand(originScript(origin))).result).toContain("ok");
    const repo = `${home}/repo218`;
    await sandbox.git.clone(`file://${origin}`, repo);
    await sandbox.git.createBranch(repo, "topic");
    await sandbox.git.checkoutBranch(repo, "topic");
    await sandbox.fs.uploadFile(Buffer.from("t\n"), `${repo}/t.txt`);
    expect((await sandbox.git.status(repo)).fileStatus.map((f) => f.name)).toEqual(["t.txt"]);
    await sandbox.git.add(repo, ["t.txt"]);
    const commit = await sandbox.git.commit(repo, "topic work", "Tester", "tester@example.com");
    expect(commit.sha).toMatch(/^[0-9a-f]{40}$/);
    expect((await sandbox.git.status(repo)).currentBranch).toBe("topic");
    await sandbox.git.checkoutBranch(repo, "main");
    await sandbox.git.deleteBranch(repo, "topic");
    expect((await sandbox.git.branches(repo)).branches).toEqual(["main"]);
    await sandbox.fs.uploadFile(Buffer.from("m\n"), `${repo}/m.txt`);
    await sandbox.git.add(repo, ["m.txt"]);
    const pushed = await sandbox.git.commit(repo, "main work", "Tester", "tester@example.com");
    await sandbox.git.push(repo);
    expect((await sandbox.process.executeCommand(`git --git-dir=${origin} rev-parse main`)).result.trim()).toBe(pushed.sha);
    const script = `set -e; git clone -q ${origin} ${home}/other218; cd ${home}/other218; echo o > o.txt; git add o.txt; git -c user.name=o -c user.email=o@example.com commit -q -m other; git push -q origin main; echo ok`;
    expect((await sandbox.process.executeCommand(script)).result).toContain("ok");
    await sandbox.git.pull(repo);
    expect((await sandbox.fs.downloadFile(`${repo}/o.txt`)).toString()).toBe("o\n");
  });

  it("LSP (python): completions and document symbols", async () => {
    const project = `${home}/py218`;
    await sandbox.fs.uploadFile(Buffer.from(PY_MODULE), `${project}/mod.py`);
    const lsp = await sandbox.createLspServer("python", project);
    await lsp.start();
    await lsp.didOpen(`${project}/mod.py`);
    expect((await lsp.completions(`${project}/mod.py`, { line: 8, character: 6 })).items.map((i) => i.label).join(" ")).toContain("make_widget");
    expect((await lsp.documentSymbols(`${project}/mod.py`)).map((x) => x.name)).toEqual(expect.arrayContaining(["WidgetFactory", "make_widget"]));
    await lsp.stop();
  });

  it("LSP (typescript): completions, document symbols, sandbox symbols under the workspacesymbols spelling", async () => {
    const project = `${home}/ts218`;
    await sandbox.fs.uploadFiles([
      { source: Buffer.from("{}"), destination: `${project}/tsconfig.json` },
      { source: Buffer.from("export class CurrentClientThing {}\nexport function currentMaker() { return new CurrentClientThing(); }\ncurrentM"), destination: `${project}/index.ts` },
    ]);
    const lsp = await sandbox.createLspServer("typescript", project);
    await lsp.start();
    await lsp.didOpen(`${project}/index.ts`);
    expect((await lsp.completions(`${project}/index.ts`, { line: 2, character: 8 })).items.map((i) => i.label)).toContain("currentMaker");
    expect((await lsp.documentSymbols(`${project}/index.ts`)).map((x) => x.name)).toEqual(expect.arrayContaining(["CurrentClientThing", "currentMaker"]));
    expect((await lsp.sandboxSymbols("CurrentClientThing")).map((x) => x.name)).toContain("CurrentClientThing");
    await lsp.stop();
  });

  it("stop, start, archive, start again (files survive), delete (waiting for destroyed)", async () => {
    await sandbox.fs.uploadFile(Buffer.from("kept\n"), `${home}/kept.txt`);
    await sandbox.stop();
    expect(sandbox.state).toBe("stopped");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile(`${home}/kept.txt`)).toString()).toBe("kept\n");
    await sandbox.stop();
    await sandbox.archive();
    expect(sandbox.state).toBe("archived");
    await sandbox.start(120);
    expect(sandbox.state).toBe("started");
    expect((await sandbox.fs.downloadFile(`${home}/kept.txt`)).toString()).toBe("kept\n");
    await sandbox.delete(60, true);
    expect(sandbox.state).toBe("destroyed");
    expect((await daytona.get(sandbox.id)).state).toBe("destroyed"); // readable by id for a grace period, as the reference's
  }, 300_000);
});
