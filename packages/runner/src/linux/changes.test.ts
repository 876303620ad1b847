import { spawnSync } from "node:child_process";
import { mkdtemp, mkdir, readFile, readdir, rm, writeFile, chmod } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ChangesPart, type ChangesQuery, readChangeset } from "../host/changeset.ts";
import type { Change } from "../host/changes.ts";
import { disposeFixture } from "../testing/dispose.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";

// Changesets of real sandboxes: what the walk of the upper reports for each kind of change, the
// tar and the diff made of it, and a read that stops early releasing what it held.

let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  f = await fixture();
  // A base tree the sandbox changes: world-writable so the unprivileged sandbox user may.
  const base = path.join(f.rootfs, "srv/base");
  await mkdir(path.join(base, "tree/sub"), { recursive: true });
  await writeFile(path.join(base, "edit.txt"), "one\ntwo\nthree\n");
  await writeFile(path.join(base, "gone.txt"), "bye\n");
  await writeFile(path.join(base, "moved.txt"), "moving\n");
  await writeFile(path.join(base, "tree/a.txt"), "a\n");
  await writeFile(path.join(base, "tree/sub/b.txt"), "b\n");
  await writeFile(path.join(base, "blob.bin"), Buffer.from([0, 1, 2, 3]));
  spawnSync("chmod", ["-R", "a+rwX", path.join(f.rootfs, "srv/base")]);
  await chmod(path.join(f.rootfs, "srv"), 0o755);
});

afterAll(() => disposeFixture(f, created));

async function make(): Promise<string> {
  const id = uniqueId("chg");
  created.add(id);
  await f.provider.create(f.spec(id));
  await f.provider.start(id);
  return id;
}

const read = (id: string, q: ChangesQuery) => readChangeset(() => f.provider.changeLayers(id, { consistent: q.consistent }), q);

async function list(id: string, q: Partial<ChangesQuery> = {}): Promise<Change[]> {
  const out: Change[] = [];
  for await (const p of read(id, { format: "list", ...q })) if (p.case === "change") out.push(p.value);
  return out;
}

async function bytes(parts: AsyncIterable<ChangesPart>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const p of parts) if (p.case === "data") chunks.push(Buffer.from(p.value));
  return Buffer.concat(chunks);
}

const brief = (cs: Change[]) => cs.map((c) => `${c.kind} ${c.type} ${c.path}`);

describe("changesets of a sandbox's upper", () => {
  let id: string;

  beforeAll(async () => {
    id = await make();
    const r = await sh(f.provider, id, [
      "set -e",
      "cd /srv/base",
      "printf 'one\\nTWO\\nthree\\n' > edit.txt",
      "rm gone.txt",
      "mv moved.txt renamed.txt",
      "rm -rf tree && mkdir -p tree/new && echo fresh > tree/new/c.txt",
      "printf '\\0\\1' > blob.bin",
      "mkdir -p /tmp/work && echo hi > /tmp/work/hello.txt && ln -s hello.txt /tmp/work/link",
      "mkdir -p /tmp/text && printf 'a\\nb' > /tmp/text/noeol.txt && printf 'one\\ntwo\\nthree\\n' > /tmp/text/lines.txt && : > /tmp/text/empty.txt",
    ].join("\n"));
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
  });

  it("lists added, modified and deleted paths, a replaced directory's old entries as deleted", async () => {
    const all = await list(id);
    const mine = brief(all.filter((c) => c.path.startsWith("/srv/base") || c.path.startsWith("/tmp/work")));
    expect(brief(all.filter((c) => c.path.startsWith("/tmp/text")))).toEqual(["added directory /tmp/text", "added file /tmp/text/empty.txt", "added file /tmp/text/lines.txt", "added file /tmp/text/noeol.txt"]);
    expect(mine).toEqual([
      "modified file /srv/base/blob.bin",
      "modified file /srv/base/edit.txt",
      "deleted file /srv/base/gone.txt",
      "deleted file /srv/base/moved.txt",
      "added file /srv/base/renamed.txt",
      "modified directory /srv/base/tree",
      "deleted file /srv/base/tree/a.txt",
      "added directory /srv/base/tree/new",
      "added file /srv/base/tree/new/c.txt",
      "deleted directory /srv/base/tree/sub",
      "added directory /tmp/work",
      "added file /tmp/work/hello.txt",
      "added symlink /tmp/work/link",
    ]);
    const edit = all.find((c) => c.path === "/srv/base/edit.txt")!;
    expect(edit.size).toBe(14);
    expect(edit.mode & 0o170000).toBe(0o100000);
    // The platform's own files are not the user's changes.
    expect(all.filter((c) => /^\/(run\/sandbar|opt\/sandbar|tmp\/\.sandbar-agent)(\/|$)/.test(c.path))).toEqual([]);
  });

  it("filters by prefix and pages by cursor in walk order", async () => {
    expect(brief(await list(id, { prefix: "/srv/base/tree" }))).toEqual([
      "modified directory /srv/base/tree",
      "deleted file /srv/base/tree/a.txt",
      "added directory /srv/base/tree/new",
      "added file /srv/base/tree/new/c.txt",
      "deleted directory /srv/base/tree/sub",
    ]);
    const after = brief(await list(id, { prefix: "/srv/base", after: "/srv/base/tree/new" }));
    expect(after).toEqual(["added file /srv/base/tree/new/c.txt", "deleted directory /srv/base/tree/sub"]);
  });

  it("archives the changed files with deletions as OCI whiteouts", async () => {
    const tar = await bytes(read(id, { format: "tar", prefix: "/srv/base" }));
    const dir = await mkdtemp(path.join(os.tmpdir(), "chg-tar-"));
    try {
      const x = spawnSync("tar", ["-x", "-C", dir], { input: tar });
      expect(x.stderr.toString()).toBe("");
      expect(await readFile(path.join(dir, "srv/base/edit.txt"), "utf8")).toBe("one\nTWO\nthree\n");
      expect(await readFile(path.join(dir, "srv/base/tree/new/c.txt"), "utf8")).toBe("fresh\n");
      expect((await readdir(path.join(dir, "srv/base"))).sort()).toEqual([".wh.gone.txt", ".wh.moved.txt", "blob.bin", "edit.txt", "renamed.txt", "tree"]);
      expect((await readdir(path.join(dir, "srv/base/tree"))).sort()).toEqual([".wh.a.txt", ".wh.sub", "new"]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("diffs text files and names binary ones", async () => {
    const diff = (await bytes(read(id, { format: "diff", prefix: "/srv/base" }))).toString();
    expect(diff).toContain("--- a/srv/base/edit.txt\n+++ b/srv/base/edit.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n");
    expect(diff).toContain("--- a/srv/base/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n");
    expect(diff).toContain("--- /dev/null\n+++ b/srv/base/renamed.txt\n");
    expect(diff).toContain("Binary files a/srv/base/blob.bin and b/srv/base/blob.bin differ\n");
  });

  it("writes whole added files' hunks as diff -u does", async () => {
    const text = (await bytes(read(id, { format: "diff", prefix: "/tmp/text" }))).toString();
    const dir = await mkdtemp(path.join(os.tmpdir(), "chg-diff-"));
    try {
      let expected = "";
      for (const [name, content] of [["empty.txt", ""], ["lines.txt", "one\ntwo\nthree\n"], ["noeol.txt", "a\nb"]]) {
        await writeFile(path.join(dir, name), content);
        expected += spawnSync("diff", ["-u", "--label", "/dev/null", "--label", `b/tmp/text/${name}`, "/dev/null", path.join(dir, name)]).stdout.toString();
      }
      expect(text).toBe(expected);
      expect(text).toContain("\\ No newline at end of file\n");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("a consistent read freezes the sandbox and always thaws it, also when the reader stops early", async () => {
    const parts = read(id, { format: "list", consistent: true });
    for await (const _ of parts) {
      expect(await f.provider.cgroups.frozen(id)).toBe(true);
      break;
    }
    expect(await f.provider.cgroups.frozen(id)).toBe(false);
    expect((await sh(f.provider, id, "echo alive")).stdout).toBe("alive\n");
  });

  it("reads a stopped sandbox's upper, also on its disk image (mounted read-only for the read, then released)", async () => {
    for (const over of [{}, { diskGiB: 1 }]) {
      const other = uniqueId("chg");
      created.add(other);
      await f.provider.create(f.spec(other, over));
      await f.provider.start(other);
      await sh(f.provider, other, "echo x > /tmp/kept.txt");
      expect(brief(await list(other, { prefix: "/tmp/kept.txt" }))).toEqual(["added file /tmp/kept.txt"]);
      await f.provider.stop(other);
      expect(brief(await list(other, { prefix: "/tmp/kept.txt" }))).toEqual(["added file /tmp/kept.txt"]);
      // Nothing held: it starts again.
      await f.provider.start(other);
      expect((await sh(f.provider, other, "cat /tmp/kept.txt")).stdout).toBe("x\n");
    }
  });

  it("refuses bad queries", async () => {
    await expect(list(id, { prefix: "relative" })).rejects.toThrow(/pathPrefix: "relative" is not an absolute path/);
    await expect(list(id, { prefix: "/a/../b" })).rejects.toThrow(/must not contain/);
    await expect(bytes(read(id, { format: "zip" as "tar" }))).rejects.toThrow(/format: must be one of list, tar, diff/);
    await expect(list("no-such-sandbox")).rejects.toThrow(/not found/);
  });
});

describe("a large changeset", () => {
  it("streams 10,000 files: the walk reads the upper as the reader pulls, never all of it first", async () => {
    const id = await make();
    const r = await sh(f.provider, id, "mkdir -p /tmp/many && cd /tmp/many && for d in $(seq 0 99); do mkdir d$d; for i in $(seq 0 99); do echo $d-$i > d$d/f$i; done; done", 120_000);
    expect(r.code).toBe(0);
    let files = 0;
    for await (const p of read(id, { format: "list", prefix: "/tmp/many" })) if (p.case === "change" && p.value.type === "file") files++;
    expect(files).toBe(10_000);
    // A file written into the last directory (d99 in walk order) after the first parts came is in the rest of the
    // same read: nothing of that directory had been read when the first parts were sent.
    for (const format of ["list", "tar"] as const) {
      const late = `/tmp/many/d99/late-${format}.txt`;
      const parts = read(id, { format, prefix: "/tmp/many" })[Symbol.asyncIterator]();
      const seen: Buffer[] = [];
      const paths: string[] = [];
      const take = (n: IteratorResult<ChangesPart>) => {
        if (n.done) return;
        if (n.value.case === "data") seen.push(Buffer.from(n.value.value));
        else paths.push(n.value.value.path);
      };
      for (let i = 0; i < 4; i++) take(await parts.next());
      expect((await sh(f.provider, id, `echo late > ${late}`)).code).toBe(0);
      for (let n = await parts.next(); !n.done; n = await parts.next()) take(n);
      if (format === "list") expect(paths).toContain(late);
      else expect(Buffer.concat(seen).includes(Buffer.from(late.slice(1)))).toBe(true);
    }
  }, 300_000);
});
