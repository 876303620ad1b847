import { spawnSync } from "node:child_process";
import { mkdtemp, readFile, readdir, readlink, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_SNAPSHOT } from "./create-request.ts";
import { type SandboxDto, type SandboxFixture, sandboxFixture } from "./testing/fixtures.ts";

// The changeset API over REST against real sandboxes of the default snapshot: a page of entries,
// the tar and the diff, pages by cursor, and the refusals.

let f: SandboxFixture;
let s: SandboxDto;

interface Entry { path: string; kind: string; type: string; size: number; mode: number; mtime: string }
const raw = (p: string, key = f.t.adminKey) => fetch(`${f.t.url}/api${p}`, { headers: { authorization: `Bearer ${key}` } });
const brief = (items: Entry[]) => items.map((c) => `${c.kind} ${c.type} ${c.path}`);

beforeAll(async () => {
  f = await sandboxFixture();
  s = await f.create({ user: "root" });
});

afterAll(() => f?.stop());

describe("changes of a sandbox", () => {
  it("a fresh sandbox has changed nothing: the platform's own writes (its user, its home, its dirs) are left out", async () => {
    const fresh = await f.create({});
    const r = await f.call("GET", `/sandbox/${fresh.id}/changes`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toEqual({ items: [] });
    // The user's own line in passwd is theirs to report; so is what they write in the home.
    await f.exec(fresh.id, "echo hi > ~/hello.txt");
    expect(brief((await f.call("GET", `/sandbox/${fresh.id}/changes`)).body.items)).toEqual(["added file /home/sandbar/hello.txt"]);
    await f.call("DELETE", `/sandbox/${fresh.id}`);
  });

  it("lists what was written, modified, deleted and renamed; tar and diff reproduce it", async () => {
    // Root's home is the sandbox's (the snapshot's files in it stay the snapshot's: replaced, not written in place).
    const r = await f.exec(s.id, [
      "set -e",
      "echo new > /root/new.txt",
      "sed -i '1i # changed by the user' /root/.profile",
      "mv /root/.bashrc /root/bashrc.moved",
      "mkdir -p /tmp/made/deep && echo deep > /tmp/made/deep/x.txt && ln -s deep/x.txt /tmp/made/link",
    ].join("\n"));
    expect(r.exitCode, r.result).toBe(0);
    const page = await f.call("GET", `/sandbox/${s.id}/changes`);
    expect(page.status).toBe(200);
    const items = (page.body as { items: Entry[]; nextCursor?: string }).items;
    const listed = brief(items);
    expect(listed).toEqual([
      "deleted file /root/.bashrc",
      "modified file /root/.profile",
      "added file /root/bashrc.moved",
      "added file /root/new.txt",
      "added directory /tmp/made",
      "added directory /tmp/made/deep",
      "added file /tmp/made/deep/x.txt",
      "added symlink /tmp/made/link",
    ]);
    const profile = items.find((c) => c.path === "/root/.profile")!;
    expect(profile.size).toBeGreaterThan(20);
    expect(profile.mode & 0o170000).toBe(0o100000);
    expect(Date.parse(profile.mtime)).toBeGreaterThan(0);
    expect((page.body as { nextCursor?: string }).nextCursor).toBeUndefined();

    // Pages: two at a time give the same entries in the same order.
    const paged: Entry[] = [];
    let cursor: string | undefined;
    do {
      const p = await f.call("GET", `/sandbox/${s.id}/changes?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      expect(p.status).toBe(200);
      const body = p.body as { items: Entry[]; nextCursor?: string };
      expect(body.items.length).toBeLessThanOrEqual(2);
      paged.push(...body.items);
      cursor = body.nextCursor;
    } while (cursor);
    expect(brief(paged)).toEqual(listed);
    expect(brief((await f.call("GET", `/sandbox/${s.id}/changes?pathPrefix=/tmp`)).body.items)).toEqual(listed.filter((l) => l.includes(" /tmp/")));

    const tar = await raw(`/sandbox/${s.id}/changes?format=tar`);
    expect(tar.status).toBe(200);
    expect(tar.headers.get("content-type")).toBe("application/x-tar");
    const dir = await mkdtemp(path.join(os.tmpdir(), "changes-tar-"));
    try {
      const x = spawnSync("tar", ["-x", "-C", dir], { input: Buffer.from(await tar.arrayBuffer()) });
      expect(x.status, x.stderr.toString()).toBe(0);
      expect(await readFile(path.join(dir, "root/new.txt"), "utf8")).toBe("new\n");
      expect(await readFile(path.join(dir, "root/.profile"), "utf8")).toMatch(/^# changed by the user\n/);
      expect((await readdir(path.join(dir, "root"))).sort()).toEqual([".profile", ".wh..bashrc", "bashrc.moved", "new.txt"]);
      expect(await readFile(path.join(dir, "tmp/made/deep/x.txt"), "utf8")).toBe("deep\n");
      expect(await readlink(path.join(dir, "tmp/made/link"))).toBe("deep/x.txt");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }

    // The export's own path answers the same bytes.
    const atPath = await raw(`/sandbox/${s.id}/changes/diff?pathPrefix=/root`);
    expect(atPath.headers.get("content-type")).toBe("text/x-diff; charset=utf-8");
    const diff = await raw(`/sandbox/${s.id}/changes?format=diff&pathPrefix=/root`);
    expect(diff.status).toBe(200);
    expect(diff.headers.get("content-type")).toBe("text/x-diff; charset=utf-8");
    const text = await diff.text();
    expect(await atPath.text()).toBe(text);
    expect(text).toMatch(/^--- a\/root\/.bashrc\n\+\+\+ \/dev\/null\n@@ /);
    expect(text).toContain("--- a/root/.profile\n+++ b/root/.profile\n@@ -1,");
    expect(text).toContain("\n+# changed by the user\n");
    expect(text).toContain("--- /dev/null\n+++ b/root/new.txt\n@@ -0,0 +1 @@\n+new\n");
  });

  it("serves the same over gRPC: a page of entries and the diff's bytes", async () => {
    const client = createClient(SandboxChangesService, createGrpcTransport({ baseUrl: f.t.url }));
    const headers = { authorization: `Bearer ${f.t.adminKey}` };
    const page = await client.listSandboxChanges({ sandboxId: s.id, pathPrefix: "/root/new.txt" }, { headers });
    expect(page.items.map((c) => [c.path, c.kind, c.type, c.size])).toEqual([["/root/new.txt", "added", "file", 4n]]);
    let diff = "";
    for await (const chunk of client.exportSandboxChanges({ sandboxId: s.id, format: "diff", pathPrefix: "/root/new.txt" }, { headers })) diff += Buffer.from(chunk.data).toString();
    expect(diff).toBe("--- /dev/null\n+++ b/root/new.txt\n@@ -0,0 +1 @@\n+new\n");
    await expect(client.listSandboxChanges({ sandboxId: s.id, since: "cp1" }, { headers })).rejects.toThrow(/since: Snapshot cp1 not found/);
  });

  it("reads a stopped sandbox (its upper stays on disk)", async () => {
    const other = await f.create({});
    await f.exec(other.id, "echo kept > /tmp/kept.txt");
    expect((await f.call("POST", `/sandbox/${other.id}/stop`)).body.state).toBe("stopped");
    const r = await f.call("GET", `/sandbox/${other.id}/changes?pathPrefix=/tmp/kept.txt&consistent=true`);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(brief(r.body.items)).toEqual(["added file /tmp/kept.txt"]);
    await f.call("DELETE", `/sandbox/${other.id}`);
  });

  it("refuses bad input with a clear 4xx", async () => {
    const bad = async (query: string) => {
      const r = await f.call("GET", `/sandbox/${s.id}/changes${query}`);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      return r.body.message as string;
    };
    expect(await bad("?format=zip")).toBe('format: must be one of json, tar, diff (got "zip")');
    expect(await bad("/zip")).toBe('format: must be one of tar, diff (got "zip")');
    expect(await bad("?pathPrefix=etc")).toBe('pathPrefix: "etc" is not an absolute path');
    expect(await bad("?limit=0")).toBe("limit: must be between 1 and 10000");
    expect(await bad("?limit=x")).toBe("limit: must be a whole number");
    expect(await bad("?consistent=yes")).toBe("consistent: must be true or false");
    expect(await bad("?since=before-install")).toBe("since: Snapshot before-install not found");
    expect(await bad("?format=tar&since=x")).toBe("since: Snapshot x not found");
    // An image's snapshot is no checkpoint: it names no state of a sandbox.
    expect(await bad(`?since=${DEFAULT_SNAPSHOT}`)).toBe(`since: snapshot ${DEFAULT_SNAPSHOT} is not a checkpoint (only snapshots of a sandbox, POST /sandbox/{id}/snapshot, are)`);
    const { key } = await f.otherOrganization();
    const foreign = await f.call("GET", `/sandbox/${s.id}/changes`, undefined, key);
    expect(foreign.status).toBe(404);
    expect((await raw(`/sandbox/${s.id}/changes?format=tar`, key)).status).toBe(404);
    expect((await f.call("GET", `/sandbox/${s.id}/changes`, undefined, "sbr_wrong")).status).toBe(401);
  });
});
