import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LanguageId } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import { eventually } from "../../protocol/src/testing/eventually.ts";
import { registryAccount, pushTestImage } from "../../control/src/snapshots/testing/image.ts";
import { startTestServer, type TestServer } from "../../control/src/testing/server.ts";
import { startRegistry, type TestRegistry } from "../../runner/src/images/testing/registry.ts";
import {
  CanceledError,
  NotFoundError,
  Permission,
  PermissionDeniedError,
  Sandbar,
  SandboxState,
  SnapshotState,
  TimeoutError,
  UnauthenticatedError,
  type Sandbox,
} from "./index.ts";

// The SDK against a real control server (embedded PostgreSQL), real sandboxes (root) and a real
// registry on loopback for the snapshot build; every call goes over gRPC (HTTP/2) as a program's would.

let t: TestServer;
let reg: TestRegistry;
let scratch: string;
let image: string;
let sandbar: Sandbar;
let sandbox: Sandbox;
let home: string;

/** A client of the test server that reads nothing from this machine's environment or files. */
const clientFor = (apiKey: string, extra: Partial<ConstructorParameters<typeof Sandbar>[0]> = {}) =>
  new Sandbar({ apiKey, apiUrl: `${t.url}/api`, env: {}, envFileDir: false, configDir: path.join(scratch, "no-config"), ...extra });

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-sdk-"));
  reg = await startRegistry();
  image = await pushTestImage(reg, scratch);
  t = await startTestServer({ control: { registryCredentials: registryAccount(reg) } });
  sandbar = clientFor(t.adminKey);
  sandbox = await sandbar.sandboxes.create({ labels: { suite: "sdk" } });
  home = (await sandbox.agentInfo.getUserHomeDir({})).dir;
}, 180_000);

afterAll(async () => {
  sandbar?.close();
  await t?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe("sandboxes", () => {
  it("creates a started sandbox, reads it by id and name, lists it by label", async () => {
    expect(sandbox.state).toBe(SandboxState.STARTED);
    expect(sandbox.info.labels).toEqual({ suite: "sdk" });
    expect((await sandbar.sandboxes.get(sandbox.id)).id).toBe(sandbox.id);
    expect((await sandbar.sandboxes.get(sandbox.name)).id).toBe(sandbox.id);
    const listed = await sandbar.sandboxes.list({ labels: JSON.stringify({ suite: "sdk" }) });
    expect(listed.items.map((s) => s.id)).toEqual([sandbox.id]);
    const all: string[] = [];
    for await (const s of sandbar.sandboxes.listAll({ limit: 1 })) all.push(s.id);
    expect(all).toContain(sandbox.id);
  });

  it("stops, starts, archives and deletes a second sandbox", async () => {
    const s = await sandbar.sandboxes.create({ name: "sdk-lifecycle" });
    await s.stop();
    await s.waitUntilStopped({ timeoutMs: 30_000 });
    expect(s.state).toBe(SandboxState.STOPPED);
    // Waiting for a state that does not come ends at the deadline.
    await expect(s.waitUntilStarted({ timeoutMs: 300 })).rejects.toBeInstanceOf(TimeoutError);
    await sandbar.sandboxes.start("sdk-lifecycle");
    await s.waitUntilStarted({ timeoutMs: 30_000 });
    expect((await s.process.exec("echo back")).result).toBe("back\n");
    await s.stop();
    await s.waitUntilStopped({ timeoutMs: 30_000 });
    await s.archive();
    expect([SandboxState.ARCHIVING, SandboxState.ARCHIVED]).toContain(s.state);
    await s.delete();
    expect([SandboxState.DESTROYING, SandboxState.DESTROYED]).toContain(s.state);
  }, 120_000);

  it("pauses a sandbox; a call to it resumes it", async () => {
    const s = await sandbar.sandboxes.create({ name: "sdk-pause", autoStopInterval: 0 });
    await s.pause();
    expect(s.state).toBe(SandboxState.PAUSED);
    expect((await s.process.exec("echo awake")).result).toBe("awake\n");
    await s.refresh();
    expect(s.state).toBe(SandboxState.STARTED);
    await s.delete();
  }, 120_000);

  it("fails with NotFoundError for a sandbox that is not there, on the control API and the toolbox", async () => {
    const err = await sandbar.sandboxes.get("no-such-sandbox").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NotFoundError);
    expect(err).toMatchObject({ code: "not_found", status: 404 });
    await expect(sandbar.sandboxes.handleFor("no-such-sandbox").process.exec("true")).rejects.toBeInstanceOf(NotFoundError);
  });
});

describe("toolbox", () => {
  it("fs: uploads from a Buffer, a Node stream, a web stream and a path; downloads as a stream and to a path", async () => {
    const dir = `${home}/sdk-fs`;
    await sandbox.fs.mkdir(dir);
    const stored = await sandbox.fs.upload(`${dir}/a.txt`, Buffer.from("alpha\n"));
    expect(Number(stored.bytes)).toBe(6);
    await sandbox.fs.upload(`${dir}/b.txt`, Readable.from([Buffer.from("be"), Buffer.from("ta\n")]));
    await sandbox.fs.upload(`${dir}/c.txt`, new Blob(["gamma\n"]).stream());
    const local = path.join(scratch, "local.bin");
    const bytes = Buffer.alloc(3 * 1024 * 1024 + 7, 0x5a); // several 1 MiB messages
    await writeFile(local, bytes);
    const up: [number, number | undefined][] = [];
    await sandbox.fs.uploadFile(local, `${dir}/d.bin`, { onProgress: (n, total) => up.push([n, total]) });
    expect(up.length).toBe(4);
    expect(up.at(-1)).toEqual([bytes.length, bytes.length]);

    expect((await sandbox.fs.readFile(`${dir}/a.txt`)).toString()).toBe("alpha\n");
    expect((await sandbox.fs.readFile(`${dir}/b.txt`)).toString()).toBe("beta\n");
    expect((await sandbox.fs.readFile(`${dir}/c.txt`)).toString()).toBe("gamma\n");
    let info;
    let chunks = 0;
    for await (const c of sandbox.fs.download(`${dir}/d.bin`, { onInfo: (i) => (info = i) })) chunks += c.length > 0 ? 1 : 0;
    expect(info).toMatchObject({ name: "d.bin", isDir: false });
    expect(chunks).toBeGreaterThan(1);
    const back = path.join(scratch, "back.bin");
    let down: [number, number | undefined] = [0, 0];
    expect(await sandbox.fs.downloadFile(`${dir}/d.bin`, back, { onProgress: (n, total) => (down = [n, total]) })).toBe(bytes.length);
    expect(down).toEqual([bytes.length, bytes.length]);
    expect((await readFile(back)).equals(bytes)).toBe(true);
    const missing = path.join(scratch, "missing.bin");
    await expect(sandbox.fs.downloadFile(`${dir}/nope.bin`, missing)).rejects.toBeInstanceOf(NotFoundError);
    await expect(readFile(missing)).rejects.toMatchObject({ code: "ENOENT" });

    expect((await sandbox.fs.list(dir)).map((f) => f.name).sort()).toEqual(["a.txt", "b.txt", "c.txt", "d.bin"]);
    expect(Number((await sandbox.fs.stat(`${dir}/d.bin`)).size)).toBe(bytes.length);
    await sandbox.fs.move(`${dir}/a.txt`, `${dir}/moved.txt`);
    await sandbox.fs.delete(`${dir}/b.txt`);
    expect((await sandbox.fs.list(dir)).map((f) => f.name).sort()).toEqual(["c.txt", "d.bin", "moved.txt"]);
    await expect(sandbox.fs.stat(`${dir}/b.txt`)).rejects.toBeInstanceOf(NotFoundError);
    await sandbox.fs.delete(dir, { recursive: true });
    await expect(sandbox.fs.list(dir)).rejects.toBeInstanceOf(NotFoundError);
  });

  it("process.exec: exit code and output, cwd and env", async () => {
    const r = await sandbox.process.exec('echo "$GREETING from $(pwd)"; exit 3', { cwd: "/tmp", env: { GREETING: "hi" } });
    expect(r).toMatchObject({ exitCode: 3, result: "hi from /tmp\n" });
  });

  it("process.run: output handed over as written, stdout and stderr apart, and the exit code", async () => {
    const out: string[] = [];
    const err: string[] = [];
    const d = new TextDecoder();
    const r = await sandbox.process.run("echo one; sleep 0.3; echo two; echo bad >&2; exit 4", {
      onStdout: (b) => out.push(d.decode(b)),
      onStderr: (b) => err.push(d.decode(b)),
    });
    expect(r.exitCode).toBe(4);
    expect(out.join("")).toBe("one\ntwo\n");
    expect(err.join("")).toBe("bad\n");
    expect((await sandbox.process.listSessions()).filter((s) => s.sessionId.startsWith("run-"))).toEqual([]);
  });

  it("sessions: logs() follows a running command's output as it is written, stdout and stderr apart", async () => {
    await sandbox.process.createSession("sdk-session");
    // The command holds its later lines until the gate opens, and the test opens it only once the
    // first line has come: logs() that read only at the end would never get there.
    const gate = `${home}/sdk-session.gate`;
    const started = await sandbox.process.sessionExec("sdk-session", `echo line 1; until [ -e ${gate} ]; do sleep 0.05; done; for i in 2 3; do echo line $i; done; echo oops >&2`, { async: true });
    expect(started.cmdId).toBeTruthy();
    const seen: { stream: string; text: string }[] = [];
    const decoder = new TextDecoder();
    for await (const chunk of sandbox.process.logs("sdk-session", started.cmdId)) {
      if (!chunk.data.case) continue;
      seen.push({ stream: chunk.data.case, text: decoder.decode(chunk.data.value) });
      if (seen.length === 1) await sandbox.fs.upload(gate, "");
    }
    const out = seen.filter((c) => c.stream === "stdout").map((c) => c.text).join("");
    expect(out).toBe("line 1\nline 2\nline 3\n");
    expect(seen.filter((c) => c.stream === "stderr").map((c) => c.text).join("")).toBe("oops\n");
    expect(seen[0]).toEqual({ stream: "stdout", text: "line 1\n" });
    const cmd = await sandbox.process.client.getSessionCommand({ sessionId: "sdk-session", commandId: started.cmdId });
    expect(cmd.exitCode).toBe(0);
    expect((await sandbox.process.listSessions()).map((s) => s.sessionId)).toContain("sdk-session");
    const sync = await sandbox.process.sessionExec("sdk-session", "echo done");
    expect(sync.exitCode).toBe(0);
    await sandbox.process.deleteSession("sdk-session");
    await expect(sandbox.process.getSession("sdk-session")).rejects.toBeInstanceOf(NotFoundError);
  });

  it("pty: input, resize, output, exit", async () => {
    const pty = await sandbox.pty.create({ cols: 80, rows: 24, cwd: home });
    let screen = "";
    const decoder = new TextDecoder();
    let exit: number | undefined;
    const reading = (async () => {
      for await (const e of pty.events()) {
        if (e.event.case === "data") screen += decoder.decode(e.event.value, { stream: true });
        if (e.event.case === "exit") exit = e.event.value.exitCode;
      }
    })();
    const until = (re: RegExp) => eventually(`the screen to show ${re}`, () => re.test(screen));
    await pty.input("stty size\n");
    await until(/24 80/);
    expect((await pty.resize(120, 40)).cols).toBe(120);
    await pty.input("stty size\n");
    await until(/40 120/);
    expect((await sandbox.pty.list()).map((p) => p.id)).toContain(pty.id);
    await pty.input("exit 7\n");
    await reading;
    expect(exit).toBe(7);
  });

  it("git: a repository's add, commit, status, branches", async () => {
    const repo = `${home}/sdk-repo`;
    expect((await sandbox.process.exec(`git init -q -b main ${repo}`)).exitCode).toBe(0);
    await sandbox.fs.upload(`${repo}/README.md`, "hello\n");
    expect((await sandbox.git.getStatus({ path: repo })).fileStatus.map((f) => f.name)).toEqual(["README.md"]);
    await sandbox.git.add({ path: repo, files: ["README.md"] });
    const commit = await sandbox.git.commit({ path: repo, message: "first", author: "Ada", email: "ada@example.test" });
    expect(commit.hash).toMatch(/^[0-9a-f]{40}$/);
    await sandbox.git.createBranch({ path: repo, name: "topic" });
    expect((await sandbox.git.listBranches({ path: repo })).branches.sort()).toEqual(["main", "topic"]);
    // As the reference does, creating a branch checks it out.
    expect((await sandbox.git.getStatus({ path: repo })).currentBranch).toBe("topic");
    await sandbox.git.checkout({ path: repo, branch: "main" });
    expect((await sandbox.git.getStatus({ path: repo })).currentBranch).toBe("main");
    expect((await sandbox.git.getHistory({ path: repo })).commits.map((c) => c.message.trim())).toEqual(["first"]);
  });

  it("lsp (python): completions and document symbols", async () => {
    const project = `${home}/sdk-py`;
    await sandbox.fs.upload(`${project}/mod.py`, "class WidgetFactory:\n    pass\n\ndef make_widget():\n    return WidgetFactory()\n\nmake_w");
    const server = { languageId: LanguageId.PYTHON, pathToProject: project };
    const doc = { ...server, uri: `file://${project}/mod.py` };
    await sandbox.lsp.start(server);
    await sandbox.lsp.didOpen(doc);
    const completions = await sandbox.lsp.completions({ ...doc, position: { line: 6, character: 6 } });
    expect(completions.items.map((i) => i.label).join(" ")).toContain("make_widget");
    expect((await sandbox.lsp.documentSymbols(doc)).symbols.map((s) => s.name)).toEqual(expect.arrayContaining(["WidgetFactory", "make_widget"]));
    await sandbox.lsp.stop(server);
  }, 60_000);
});

describe("changes", () => {
  it("lists a sandbox's changes page by page, and streams them as a tar and a diff", async () => {
    await sandbox.process.exec("mkdir -p ~/chg && echo one > ~/chg/a.txt && echo two > ~/chg/b.txt");
    const pathPrefix = `${home}/chg`;
    const first = await sandbox.changes.list({ pathPrefix, limit: 2 });
    expect(first.items.map((c) => `${c.kind} ${c.type} ${c.path}`)).toEqual([`added directory ${pathPrefix}`, `added file ${pathPrefix}/a.txt`]);
    expect(first.nextCursor).toBe(`${pathPrefix}/a.txt`);
    const all = [];
    for await (const c of sandbox.changes.all({ pathPrefix, pageSize: 1 })) all.push(c.path);
    expect(all).toEqual([pathPrefix, `${pathPrefix}/a.txt`, `${pathPrefix}/b.txt`]);
    expect(await sandbox.changes.diffText({ pathPrefix: `${pathPrefix}/b.txt` })).toBe(`--- /dev/null\n+++ b${pathPrefix}/b.txt\n@@ -0,0 +1 @@\n+two\n`);
    const tarFile = path.join(scratch, "changes.tar");
    await sandbox.changes.downloadTar(tarFile, { pathPrefix });
    expect((await readFile(tarFile)).includes(Buffer.from("one\n"))).toBe(true);
    await expect(sandbox.changes.list({ since: "nope" })).rejects.toThrow(/since: Snapshot nope not found/);
  });
});

describe("cancellation", () => {
  it("an AbortSignal.timeout() ends a long call with TimeoutError; abort() with CanceledError", async () => {
    // The commands outlast the test's own timeout: an answer at all means the signal or deadline ended the call.
    await expect(sandbox.process.exec("sleep 600", { signal: AbortSignal.timeout(300) })).rejects.toBeInstanceOf(TimeoutError);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    const err = await sandbox.process.exec("sleep 600", { signal: ac.signal }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CanceledError);
    // Connect's own deadline (timeoutMs) is a TimeoutError too.
    await expect(sandbox.process.exec("sleep 600", { timeoutMs: 300 })).rejects.toBeInstanceOf(TimeoutError);
  });

  it("aborting ends a followed log stream", async () => {
    await sandbox.process.createSession("sdk-forever");
    const cmd = await sandbox.process.sessionExec("sdk-forever", "while true; do echo tick; sleep 0.1; done", { async: true });
    const ac = new AbortController();
    let ticks = 0;
    const err = await (async () => {
      for await (const _ of sandbox.process.logs("sdk-forever", cmd.cmdId, { signal: ac.signal })) if (++ticks === 3) ac.abort();
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CanceledError);
    expect(ticks).toBe(3);
    await sandbox.process.deleteSession("sdk-forever");
  });
});

describe("snapshots", () => {
  it("creates one from an image, follows its build logs to the end, lists, reads and deletes it", async () => {
    const created = await sandbar.snapshots.create({ name: "sdk-snap", imageName: image });
    const lines: string[] = [];
    for await (const line of sandbar.snapshots.buildLogs(created.id)) lines.push(line);
    expect(lines[0]).toBe(`pulling ${image}`);
    expect(lines.join("\n")).toMatch(/image sha256:[a-f0-9]{64} ready/);
    const active = await sandbar.snapshots.waitUntilActive("sdk-snap", { timeoutMs: 60_000 });
    expect(active.state).toBe(SnapshotState.ACTIVE);
    expect((await sandbar.snapshots.list({ name: "sdk-snap" })).items.map((s) => s.id)).toEqual([created.id]);
    expect((await sandbar.snapshots.get("sdk-snap")).id).toBe(created.id);
    await sandbar.snapshots.delete(created.id);
    const after = await sandbar.snapshots.get(created.id).catch((e: unknown) => e);
    if (after instanceof NotFoundError) return;
    expect(after).toMatchObject({ state: SnapshotState.REMOVING });
  }, 120_000);
});

describe("volumes, API keys, organizations", () => {
  it("volumes: create, get by id and name, list, delete", async () => {
    const v = await sandbar.volumes.create("sdk-volume");
    expect((await sandbar.volumes.get(v.id)).name).toBe("sdk-volume");
    expect((await sandbar.volumes.getByName("sdk-volume")).id).toBe(v.id);
    expect((await sandbar.volumes.list()).map((x) => x.id)).toContain(v.id);
    await sandbar.volumes.delete(v.id);
    await expect(sandbar.volumes.getByName("no-such-volume")).rejects.toBeInstanceOf(NotFoundError);
  });

  it("api keys: create with scopes as the API spells them, current, get, list, delete; a narrow key is refused; a revoked one unauthenticated", async () => {
    const created = await sandbar.apiKeys.create({ name: "sdk-narrow", permissions: ["write:sandboxes", Permission.READ_VOLUMES] });
    expect(created.value).toBeTruthy();
    expect(created.permissions).toEqual([Permission.WRITE_SANDBOXES, Permission.READ_VOLUMES]);
    expect((await sandbar.apiKeys.get("sdk-narrow")).name).toBe("sdk-narrow");
    expect((await sandbar.apiKeys.list()).map((k) => k.name)).toContain("sdk-narrow");
    const narrow = clientFor(created.value);
    expect((await narrow.apiKeys.current()).name).toBe("sdk-narrow");
    expect(await narrow.volumes.list()).toBeInstanceOf(Array);
    const denied = await narrow.volumes.create("not-allowed").catch((e: unknown) => e);
    expect(denied).toBeInstanceOf(PermissionDeniedError);
    expect(denied).toMatchObject({ status: 403 });
    await sandbar.apiKeys.delete("sdk-narrow");
    const gone = await narrow.volumes.list().catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(UnauthenticatedError);
    narrow.close();
    expect(() => sandbar.apiKeys.create({ name: "x", permissions: ["write:everything"] })).toThrow(/permissions: unknown scope "write:everything"/);
  });

  it("organizations: list, get, usage", async () => {
    const orgs = await sandbar.organizations.list();
    expect(orgs.map((o) => o.id)).toContain(sandbox.info.organizationId);
    expect((await sandbar.organizations.get(sandbox.info.organizationId)).id).toBe(sandbox.info.organizationId);
    const usage = await sandbar.organizations.usage(sandbox.info.organizationId);
    expect(usage.regionUsage.reduce((n, r) => n + r.currentCpuUsage, 0)).toBeGreaterThanOrEqual(1);
  });
});

describe("the README example", () => {
  it("builds the package with tsc, runs examples/quickstart.mjs as written, and works installed from its packed tarballs", async () => {
    const { execFile } = await import("node:child_process");
    const run = (cmd: string, args: string[], o: { cwd?: string; env?: NodeJS.ProcessEnv } = {}) =>
      new Promise<{ code: number; out: string; err: string }>((resolve) => {
        execFile(cmd, args, { ...o, timeout: 120_000 }, (e, out, err) => resolve({ code: e ? Number(e.code ?? 1) : 0, out, err }));
      });
    const sdkDir = new URL("..", import.meta.url).pathname;
    const build = await run(process.execPath, [new URL("../../../node_modules/typescript/bin/tsc", import.meta.url).pathname, "-p", `${sdkDir}tsconfig.build.json`]);
    expect(build.out + build.err).toBe("");
    // Only what a user would set: the example reads the key and URL from the environment.
    const env = { PATH: process.env.PATH, HOME: scratch, SANDBAR_API_KEY: t.adminKey, SANDBAR_API_URL: `${t.url}/api` };
    const r = await run(process.execPath, [`${sdkDir}examples/quickstart.mjs`], { cwd: scratch, env });
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^exit 0: hello from \S+\nread back: written by @sandbar\/sdk\nstdout: step 1\nstdout: step 2\nstdout: step 3\nnot found \(404\): Sandbox with ID or name no-such-sandbox not found\n$/);
    // Its finally block deleted the sandbox it made: none is left in the list.
    expect((await sandbar.sandboxes.list({ labels: JSON.stringify({ example: "quickstart" }) })).items).toEqual([]);

    // What a program elsewhere installs: the two packed tarballs (their dependencies linked from
    // this checkout, standing in for npm's download), typechecked by tsc and run by node.
    const app = path.join(scratch, "app");
    const modules = path.join(app, "node_modules");
    await mkdir(path.join(modules, "@sandbar"), { recursive: true });
    const repoModules = new URL("../../../node_modules/", import.meta.url).pathname;
    const pack = await run("npm", ["pack", "-w", "@sandbar/protocol", "-w", "@sandbar/sdk", "--pack-destination", scratch], { cwd: new URL("../../..", import.meta.url).pathname });
    expect(pack.code, pack.err).toBe(0);
    for (const name of ["protocol", "sdk"]) {
      await mkdir(path.join(modules, "@sandbar", name));
      expect((await run("tar", ["xzf", path.join(scratch, `sandbar-${name}-0.1.0.tgz`), "-C", path.join(modules, "@sandbar", name), "--strip-components=1"])).code).toBe(0);
    }
    for (const dep of ["@bufbuild", "@connectrpc", "@types"]) await symlink(path.join(repoModules, dep), path.join(modules, dep));
    await writeFile(path.join(app, "package.json"), JSON.stringify({ name: "app", type: "module", private: true }));
    await writeFile(path.join(app, "tsconfig.json"), JSON.stringify({ compilerOptions: { module: "nodenext", moduleResolution: "nodenext", strict: true, noEmit: true, types: ["node"], skipLibCheck: false, erasableSyntaxOnly: true } }));
    await writeFile(
      path.join(app, "main.ts"),
      [
        'import { Sandbar, SandboxState, RateLimitedError, type SandboxInfo } from "@sandbar/sdk";',
        "const sandbar = new Sandbar();",
        "const started = (s: SandboxInfo): boolean => s.state === SandboxState.STARTED;",
        "const { items } = await sandbar.sandboxes.list();",
        "const limited: RateLimitedError | undefined = undefined;",
        "console.log(items.length >= 1, items.every((s) => started(s.info)), limited);",
        "sandbar.close();",
      ].join("\n"),
    );
    const tsc = await run(process.execPath, [new URL("../../../node_modules/typescript/bin/tsc", import.meta.url).pathname, "-p", app]);
    expect(tsc.out + tsc.err).toBe("");
    const main = await run(process.execPath, [path.join(app, "main.ts")], { cwd: app, env });
    expect(main.err).toBe("");
    expect(main.out).toBe("true true undefined\n");
  }, 180_000);
});

describe("the 1 GiB streamed upload", () => {
  it("uploads 1 GiB from a stream with the client's memory flat, and the sandbox holds every byte", async () => {
    // A child process runs the client, so its RSS high-water mark is the client's alone (the
    // server runs in this process).
    const { spawn } = await import("node:child_process");
    const child = spawn(process.execPath, [new URL("./testing/upload-child.ts", import.meta.url).pathname, sandbox.id, `${home}/big.bin`, "1024"], {
      env: { ...process.env, SANDBAR_API_URL: `${t.url}/api`, SANDBAR_API_KEY: t.adminKey },
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((r) => child.on("exit", r));
    expect(code).toBe(0);
    const r = JSON.parse(out) as { bytes: number; sha256: string; baseRss: number; quarterPeakRss: number; peakRss: number; ms: number; cpuMs: number };
    const mib = (n: number) => (n / 2 ** 20).toFixed(0);
    console.log(`1 GiB upload over gRPC: ${(r.bytes / 2 ** 20 / (r.ms / 1000)).toFixed(0)} MiB/s; client RSS ${mib(r.baseRss)} MiB before, high-water ${mib(r.quarterPeakRss)} MiB after 256 MiB, ${mib(r.peakRss)} MiB after 1 GiB; client CPU ${(r.cpuMs / 1000).toFixed(1)} s in ${(r.ms / 1000).toFixed(1)} s`);
    expect(r.bytes).toBe(2 ** 30);
    // Bounded: the high-water mark stays within 128 MiB (an eighth of the data) of the RSS before...
    expect(r.peakRss - r.baseRss).toBeLessThan(128 * 2 ** 20);
    // ...and flat: the last 768 MiB raise it by less than 32 MiB over what the first 256 MiB reached.
    expect(r.peakRss - r.quarterPeakRss).toBeLessThan(32 * 2 ** 20);
    expect(Number((await sandbox.fs.stat(`${home}/big.bin`)).size)).toBe(2 ** 30);
    const sum = await sandbox.process.exec(`sha256sum ${home}/big.bin`, { timeout: 120 });
    expect(sum.result.split(" ")[0]).toBe(r.sha256);
    await sandbox.fs.delete(`${home}/big.bin`);
  }, 240_000);
});
