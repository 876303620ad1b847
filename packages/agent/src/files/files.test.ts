import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chmod, link, lstat, mkdir, readdir, readFile, stat, symlink, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { UploadFilesRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { startAgentProcess } from "../testing/agent-process.ts";
import type { AgentProcess } from "../testing/agent-process.ts";

let agent: AgentProcess;
let fs: ReturnType<typeof agent.client<typeof FileService>>;
let root: string;
beforeAll(async () => {
  agent = await startAgentProcess();
  fs = agent.client(FileService);
  root = agent.root;
});
afterAll(async () => {
  await agent?.stop();
});

const errOf = async (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => ConnectError.from(e));
const codeOf = async (p: Promise<unknown>) => (await errOf(p))?.code;
const p = (...parts: string[]) => path.join(root, ...parts);

describe("list and info", () => {
  it("lists one level with the reference's FileInfo fields; relative paths resolve against the work dir", async () => {
    await mkdir(p("list/sub/deeper"), { recursive: true });
    await writeFile(p("list/a.txt"), "hello");
    await chmod(p("list/a.txt"), 0o640);
    await symlink("/no/such/target", p("list/broken"));
    const { items } = await fs.listFiles({ path: "list" });
    const byName = Object.fromEntries(items.map((i) => [i.name, i]));
    expect(Object.keys(byName).sort()).toEqual(["a.txt", "sub"]);
    const a = byName["a.txt"];
    expect(a).toMatchObject({ isDir: false, size: 5n, mode: "-rw-r-----", permissions: "0640", owner: String(process.getuid!()), group: String(process.getgid!()) });
    expect(a.modTime).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC$/);
    const st = await stat(p("list/a.txt"));
    expect(Math.abs(Number(a.modifiedAt!.seconds) * 1000 - st.mtimeMs)).toBeLessThan(1000);
    expect(byName.sub).toMatchObject({ isDir: true, mode: "drwxr-xr-x", permissions: "0755" });
    expect((await fs.listFiles({})).items.map((i) => i.name)).toContain("list");
  });

  it("gives info on one path and NOT_FOUND for a missing one", async () => {
    const info = await fs.getFileInfo({ path: p("list/a.txt") });
    expect(info).toMatchObject({ name: "a.txt", size: 5n });
    const tmp = await fs.getFileInfo({ path: "/tmp" });
    expect(tmp.mode).toBe("dtrwxrwxrwx");
    const err = await errOf(fs.getFileInfo({ path: "missing.txt" }));
    expect(err?.code).toBe(Code.NotFound);
    expect(err?.rawMessage).toContain("missing.txt");
    expect(await codeOf(fs.getFileInfo({ path: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(fs.listFiles({ path: "list/a.txt" }))).toBe(Code.NotFound);
  });
});

describe("change", () => {
  it("creates folders with a mode, refuses bad modes", async () => {
    await fs.createFolder({ path: "made/x/y", mode: "700" });
    expect((await stat(p("made/x/y"))).mode & 0o777).toBe(0o700);
    await fs.createFolder({ path: "made/x/y", mode: "0700" });
    await fs.createFolder({ path: "made/z", mode: "" });
    expect((await stat(p("made/z"))).mode & 0o777).toBe(0o755);
    const err = await errOf(fs.createFolder({ path: "made/bad", mode: "rwx" }));
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toMatch(/invalid mode/);
    expect(await codeOf(fs.createFolder({ path: "made/bad", mode: "999" }))).toBe(Code.InvalidArgument);
    await writeFile(p("made/file"), "");
    expect(await codeOf(fs.createFolder({ path: "made/file", mode: "755" }))).toBe(Code.AlreadyExists);
  });

  it("deletes files, and directories only when recursive", async () => {
    await mkdir(p("del/d/e"), { recursive: true });
    await writeFile(p("del/f"), "x");
    await fs.deleteFile({ path: "del/f" });
    await expect(stat(p("del/f"))).rejects.toThrow();
    const err = await errOf(fs.deleteFile({ path: "del/d" }));
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toMatch(/recursive/);
    await fs.deleteFile({ path: "del/d", recursive: true });
    await expect(stat(p("del/d"))).rejects.toThrow();
    expect(await codeOf(fs.deleteFile({ path: "del/nothing" }))).toBe(Code.NotFound);
  });

  it("moves, refusing a taken destination and a missing source or parent", async () => {
    await mkdir(p("mv"), { recursive: true });
    await writeFile(p("mv/a"), "A");
    await writeFile(p("mv/b"), "B");
    expect(await codeOf(fs.moveFile({ source: "mv/a", destination: "mv/b" }))).toBe(Code.AlreadyExists);
    expect(await codeOf(fs.moveFile({ source: "mv/none", destination: "mv/c" }))).toBe(Code.NotFound);
    expect(await codeOf(fs.moveFile({ source: "mv/a", destination: "mv/no/dir/c" }))).toBe(Code.NotFound);
    await fs.moveFile({ source: "mv/a", destination: "mv/c" });
    expect(await readFile(p("mv/c"), "utf8")).toBe("A");
    // Across file systems (/dev/shm is tmpfs) it copies.
    const shm = `/dev/shm/agent-move-${process.pid}-${Date.now()}`;
    await fs.moveFile({ source: "mv/c", destination: shm });
    expect(await readFile(shm, "utf8")).toBe("A");
    await fs.moveFile({ source: shm, destination: "mv/back" });
    expect(await readFile(p("mv/back"), "utf8")).toBe("A");
  });

  it("sets mode, owner and group by number or name", async () => {
    await writeFile(p("perm"), "x");
    await fs.setFilePermissions({ path: "perm", mode: "600" });
    expect((await stat(p("perm"))).mode & 0o777).toBe(0o600);
    const uid = process.getuid!();
    const gid = process.getgid!();
    await fs.setFilePermissions({ path: "perm", owner: String(uid), group: String(gid) });
    if (uid === 0) {
      await fs.setFilePermissions({ path: "perm", owner: "nobody", group: "nogroup" });
      const st = await stat(p("perm"));
      expect(st.uid).toBe(65534);
      expect(st.gid).toBe(65534);
    }
    expect(await codeOf(fs.setFilePermissions({ path: "perm", owner: "no-such-user-x" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(fs.setFilePermissions({ path: "perm", group: "no-such-group-x" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(fs.setFilePermissions({ path: "perm", mode: "8" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(fs.setFilePermissions({ path: "nope", mode: "644" }))).toBe(Code.NotFound);
  });
});

describe("find, search, replace", () => {
  beforeAll(async () => {
    await mkdir(p("proj/src/lib"), { recursive: true });
    await writeFile(p("proj/src/a.ts"), "const needle = 1;\nnothing here\n  needle again // (a.*)\n");
    await writeFile(p("proj/src/lib/b.ts"), "no match\nstill no\nthe NEEDLE is case sensitive, needle is not\n");
    await writeFile(p("proj/bin.dat"), Buffer.concat([Buffer.from("needle"), Buffer.from([0, 1, 2]), Buffer.from("needle")]));
    await writeFile(p("proj/src/readme.md"), "# needle\n");
  });

  it("finds a literal substring with 1-based lines, skipping binary files", async () => {
    const { matches, truncated } = await fs.findInFiles({ path: "proj", pattern: "needle" });
    expect(truncated).toBe(false);
    const found = matches.map((m) => `${m.file}:${m.line}:${m.content}`).sort();
    expect(found).toEqual([
      "proj/src/a.ts:1:const needle = 1;",
      "proj/src/a.ts:3:  needle again // (a.*)",
      "proj/src/lib/b.ts:3:the NEEDLE is case sensitive, needle is not",
      "proj/src/readme.md:1:# needle",
    ]);
    // Literal, not a regular expression.
    const lit = await fs.findInFiles({ path: p("proj"), pattern: "(a.*)" });
    expect(lit.matches.map((m) => [path.relative(root, m.file), m.line])).toEqual([["proj/src/a.ts", 3]]);
  });

  it("bounds find results with a truncated flag", async () => {
    await mkdir(p("many"));
    await writeFile(p("many/lines.txt"), Array.from({ length: 50 }, (_, i) => `hit ${i}`).join("\n"));
    const { matches, truncated } = await fs.findInFiles({ path: "many", pattern: "hit", limit: 10 });
    expect(matches).toHaveLength(10);
    expect(truncated).toBe(true);
    expect(matches[9]).toMatchObject({ line: 10, content: "hit 9" });
  });

  it("searches base names with a glob, bounded, and refuses a malformed glob", async () => {
    const { files } = await fs.searchFiles({ path: "proj", pattern: "*.ts" });
    expect(files.sort()).toEqual(["proj/src/a.ts", "proj/src/lib/b.ts"]);
    expect((await fs.searchFiles({ path: "proj", pattern: "[ab].?s" })).files.sort()).toEqual(["proj/src/a.ts", "proj/src/lib/b.ts"]);
    expect((await fs.searchFiles({ path: "proj", pattern: "lib" })).files).toEqual(["proj/src/lib"]);
    const bounded = await fs.searchFiles({ path: "proj", pattern: "*", limit: 2 });
    expect(bounded.files).toHaveLength(2);
    expect(bounded.truncated).toBe(true);
    const err = await errOf(fs.searchFiles({ path: "proj", pattern: "[abc" }));
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toMatch(/pattern/);
    expect(await codeOf(fs.searchFiles({ path: "proj", pattern: "" }))).toBe(Code.InvalidArgument);
  });

  it("replaces literally, with one result per file", async () => {
    await writeFile(p("r1.txt"), "a.b a.b axb");
    await chmod(p("r1.txt"), 0o640);
    await writeFile(p("r2.txt"), "nothing");
    const { results } = await fs.replaceInFiles({ files: ["r1.txt", p("r2.txt"), "r-missing.txt"], pattern: "a.b", newValue: "[$&]" });
    expect(results.map((r) => [r.file, r.success, r.error !== undefined])).toEqual([
      ["r1.txt", true, false],
      [p("r2.txt"), true, false],
      ["r-missing.txt", false, true],
    ]);
    expect(results[2].error).toMatch(/no such file/);
    expect(await readFile(p("r1.txt"), "utf8")).toBe("[$&] [$&] axb");
    expect((await stat(p("r1.txt"))).mode & 0o777).toBe(0o640);
    expect(await codeOf(fs.replaceInFiles({ files: ["r1.txt"], pattern: "", newValue: "x" }))).toBe(Code.InvalidArgument);
  });

  it("replaces across read boundaries in a large file", async () => {
    const unit = "0123456789".repeat(1000) + "NEEDLE";
    const body = unit.repeat(100); // ~1 MB, needles at every offset modulo the read size
    await writeFile(p("large.txt"), body);
    await fs.replaceInFiles({ files: ["large.txt"], pattern: "NEEDLE", newValue: "n" });
    expect(await readFile(p("large.txt"), "utf8")).toBe(body.replaceAll("NEEDLE", "n"));
  });
});

describe("transfer", () => {
  it("uploads and downloads one file in chunks", async () => {
    const data = Buffer.alloc(1_000_000 + 17);
    for (let i = 0; i < data.length; i++) data[i] = (i * 31) & 0xff;
    async function* body() {
      yield { part: { case: "header" as const, value: { path: "up/nested/one.bin" } } };
      for (let off = 0; off < data.length; off += 100_000) yield { part: { case: "data" as const, value: data.subarray(off, off + 100_000) } };
    }
    const res = await fs.uploadFile(body());
    expect(res.file).toMatchObject({ path: "up/nested/one.bin", bytes: BigInt(data.length) });
    expect((await readFile(p("up/nested/one.bin"))).equals(data)).toBe(true);
    const parts: Buffer[] = [];
    let info;
    for await (const m of fs.downloadFile({ path: "up/nested/one.bin" })) {
      if (m.part.case === "info") info = m.part.value;
      if (m.part.case === "data") parts.push(Buffer.from(m.part.value));
    }
    expect(info).toMatchObject({ name: "one.bin", size: BigInt(data.length) });
    expect(Buffer.concat(parts).equals(data)).toBe(true);
  });

  it("uploads and downloads several files at once, with an error part per unreadable path", async () => {
    async function* body(): AsyncGenerator<MessageInitShape<typeof UploadFilesRequestSchema>> {
      yield { part: { case: "header", value: { path: "multi/a.txt" } } };
      yield { part: { case: "data", value: Buffer.from("alpha") } };
      yield { part: { case: "header", value: { path: p("multi/empty") } } };
      yield { part: { case: "header", value: { path: "multi/deep/b.txt" } } };
      yield { part: { case: "data", value: Buffer.from("be") } };
      yield { part: { case: "data", value: Buffer.from("ta") } };
    }
    const res = await fs.uploadFiles(body());
    expect(res.files.map((f) => [f.path, f.bytes])).toEqual([["multi/a.txt", 5n], [p("multi/empty"), 0n], ["multi/deep/b.txt", 4n]]);
    const got: Record<string, string> = {};
    const errs: Record<string, string> = {};
    let current = "";
    for await (const m of fs.downloadFiles({ paths: ["multi/a.txt", "multi/none", p("multi/empty"), "multi", "multi/deep/b.txt"] })) {
      if (m.part.case === "file") got[(current = m.part.value.path)] = "";
      if (m.part.case === "data") got[current] += Buffer.from(m.part.value).toString();
      if (m.part.case === "error") errs[m.part.value.path] = `${m.part.value.statusCode} ${m.part.value.code}`;
    }
    expect(got).toEqual({ "multi/a.txt": "alpha", [p("multi/empty")]: "", "multi/deep/b.txt": "beta" });
    expect(errs).toEqual({ "multi/none": "404 FILE_NOT_FOUND", multi: "400 INVALID_FILE_PATH" });
  });

  it("replaces a file whole: the mode it had, a symbolic link kept (its target replaced), a hard-linked file written in place", async () => {
    const up = (dest: string, text: string, headers?: Record<string, string>) => {
      async function* body() {
        yield { part: { case: "header" as const, value: { path: dest } } };
        yield { part: { case: "data" as const, value: Buffer.from(text) } };
      }
      return fs.uploadFile(body(), { headers });
    };
    await mkdir(p("replace"), { recursive: true });
    await writeFile(p("replace/script.sh"), "old");
    await chmod(p("replace/script.sh"), 0o751);
    await up("replace/script.sh", "new");
    expect([await readFile(p("replace/script.sh"), "utf8"), (await stat(p("replace/script.sh"))).mode & 0o7777]).toEqual(["new", 0o751]);
    await symlink("script.sh", p("replace/link"));
    await up("replace/link", "through the link");
    expect((await lstat(p("replace/link"))).isSymbolicLink()).toBe(true);
    expect(await readFile(p("replace/script.sh"), "utf8")).toBe("through the link");
    await writeFile(p("replace/one"), "old");
    await link(p("replace/one"), p("replace/two"));
    await up("replace/one", "both names");
    expect(await readFile(p("replace/two"), "utf8")).toBe("both names");
    // A caller that seals its uploads (control) and whose stream ends without the seal: cancelled, nothing written.
    const err = await errOf(up("replace/script.sh", "unsealed", { "x-sandbar-upload-sealed": "1" }));
    expect(err?.code).toBe(Code.Canceled);
    expect(await readFile(p("replace/script.sh"), "utf8")).toBe("through the link");
    expect((await readdir(p("replace"))).sort()).toEqual(["link", "one", "script.sh", "two"]);
  });

  it("refuses malformed uploads and downloads", async () => {
    async function* noHeader() {
      yield { part: { case: "data" as const, value: Buffer.from("x") } };
    }
    expect(await codeOf(fs.uploadFile(noHeader()))).toBe(Code.InvalidArgument);
    expect(await codeOf(fs.uploadFiles(noHeader() as AsyncIterable<MessageInitShape<typeof UploadFilesRequestSchema>>))).toBe(Code.InvalidArgument);
    const drain = async (it: AsyncIterable<unknown>) => {
      for await (const _ of it) void _;
    };
    expect(await codeOf(drain(fs.downloadFile({ path: "nothing-here" })))).toBe(Code.NotFound);
    expect(await codeOf(drain(fs.downloadFile({ path: "multi" })))).toBe(Code.InvalidArgument);
    expect(await codeOf(drain(fs.downloadFiles({ paths: [] })))).toBe(Code.InvalidArgument);
  });
});
