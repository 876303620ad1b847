import { execFileSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type SandboxDto, type SandboxFixture, sandboxFixture } from "./testing/fixtures.ts";

// Changesets since a checkpoint (a snapshot of the sandbox) with real sandboxes: the sandbox the
// checkpoint was taken of, a fork made after it, a sandbox made from it, tar and diff, and the
// snapshots that are not in the sandbox's lineage (400).

let f: SandboxFixture;
let s: SandboxDto;
let fork: SandboxDto;
const cp1 = `cp1-${process.pid}`;

interface Entry { path: string; kind: string; type: string }
const brief = (items: Entry[]) => items.map((c) => `${c.kind} ${c.type} ${c.path}`);
const raw = (p: string) => fetch(`${f.t.url}/api${p}`, { headers: { authorization: `Bearer ${f.t.adminKey}` } });
const sh = async (id: string, command: string) => {
  const r = await f.exec(id, command);
  expect(r.exitCode, r.result).toBe(0);
};
async function listed(id: string, query = ""): Promise<string[]> {
  const r = await f.call("GET", `/sandbox/${id}/changes${query}`);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return brief(r.body.items as Entry[]);
}
const snapshot = async (id: string, name: string) => {
  const r = await f.call("POST", `/sandbox/${id}/snapshot`, { name });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
};

const SINCE_CP1 = ["modified file /tmp/w/a", "deleted file /tmp/w/b", "added file /tmp/w/c"];

beforeAll(async () => {
  f = await sandboxFixture();
  s = await f.create({});
  await sh(s.id, "mkdir /tmp/w && echo one > /tmp/w/a && echo two > /tmp/w/b && echo kept > /tmp/w/kept");
  await snapshot(s.id, cp1);
  await sh(s.id, "echo changed >> /tmp/w/a && rm /tmp/w/b && echo three > /tmp/w/c");
}, 180_000);

afterAll(() => f?.stop());

describe("changes since a checkpoint", () => {
  it("lists only what changed after the checkpoint; without since, everything since creation", async () => {
    expect(await listed(s.id, `?since=${cp1}`)).toEqual(SINCE_CP1);
    expect(await listed(s.id)).toEqual(["added directory /tmp/w", "added file /tmp/w/a", "added file /tmp/w/c", "added file /tmp/w/kept"]);
    // By id too, and over gRPC.
    const id = ((await f.call("GET", `/snapshots/${cp1}`)).body as { id: string }).id;
    expect(await listed(s.id, `?since=${id}`)).toEqual(SINCE_CP1);
    const client = createClient(SandboxChangesService, createGrpcTransport({ baseUrl: f.t.url }));
    const page = await client.listSandboxChanges({ sandboxId: s.id, since: cp1 }, { headers: { authorization: `Bearer ${f.t.adminKey}` } });
    expect(page.items.map((c) => `${c.kind} ${c.type} ${c.path}`)).toEqual(SINCE_CP1);
  });

  it("tar and diff since the checkpoint", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "since-tar-"));
    try {
      const tar = await raw(`/sandbox/${s.id}/changes?format=tar&since=${cp1}`);
      expect(tar.status).toBe(200);
      await writeFile(path.join(dir, "c.tar"), Buffer.from(await tar.arrayBuffer()));
      expect(execFileSync("tar", ["-tf", path.join(dir, "c.tar")]).toString()).toBe("tmp/w/a\ntmp/w/.wh.b\ntmp/w/c\n");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    const diff = await raw(`/sandbox/${s.id}/changes/diff?since=${cp1}`);
    expect(diff.status).toBe(200);
    expect(await diff.text()).toBe([
      "--- a/tmp/w/a", "+++ b/tmp/w/a", "@@ -1 +1,2 @@", " one", "+changed",
      "--- a/tmp/w/b", "+++ /dev/null", "@@ -1 +0,0 @@", "-two",
      "--- /dev/null", "+++ b/tmp/w/c", "@@ -0,0 +1 @@", "+three", "",
    ].join("\n"));
  });

  it("a fork made after the checkpoint compares with it too; its own changes stand on the capture", async () => {
    const r = await f.call("POST", `/sandbox/${s.id}/fork`, {});
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    fork = r.body as SandboxDto;
    await sh(fork.id, "echo forked > /tmp/w/d");
    expect(await listed(fork.id, `?since=${cp1}`)).toEqual([...SINCE_CP1, "added file /tmp/w/d"]);
    expect(await listed(fork.id)).toEqual(["added file /tmp/w/d"]);
  });

  it("a sandbox made from the checkpoint stands on it", async () => {
    const made = await f.create({ snapshot: cp1 });
    expect(await listed(made.id, `?since=${cp1}`)).toEqual([]);
    await sh(made.id, "rm /tmp/w/kept");
    expect(await listed(made.id, `?since=${cp1}`)).toEqual(["deleted file /tmp/w/kept"]);
    await f.call("DELETE", `/sandbox/${made.id}`);
  });

  it("refuses snapshots that are no state of this sandbox", async () => {
    const bad = async (id: string, since: string) => {
      const r = await f.call("GET", `/sandbox/${id}/changes?since=${since}`);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      return r.body.message as string;
    };
    const other = await f.create({});
    const theirs = `unrelated-${process.pid}`;
    await snapshot(other.id, theirs);
    expect(await bad(s.id, theirs)).toBe(`since: snapshot ${theirs} is not an ancestor of this sandbox's filesystem`);
    // The fork's snapshot is not the parent's past; the parent's later one is not the fork's.
    const ofFork = `of-fork-${process.pid}`;
    await snapshot(fork.id, ofFork);
    expect(await bad(s.id, ofFork)).toMatch(/is not an ancestor/);
    const later = `later-${process.pid}`;
    await snapshot(s.id, later);
    expect(await bad(fork.id, later)).toMatch(/is not an ancestor/);
    expect(await listed(fork.id, `?since=${ofFork}`)).toEqual([]);
    expect(await bad(s.id, "no-such-snapshot")).toBe("since: Snapshot no-such-snapshot not found");
    await f.call("DELETE", `/sandbox/${other.id}`);
  });
});
