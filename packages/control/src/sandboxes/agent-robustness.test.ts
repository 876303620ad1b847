import { rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";

// Real sandboxes running the real agent, through the REST API as clients call it: what a
// sandbox's own workload does to its disk and its processes, and what the API answers then.

let bundle: string;
let f: SandboxFixture;

beforeAll(async () => {
  bundle = await buildAgentBundle();
  f = await sandboxFixture({ agentBundle: bundle });
});

afterAll(async () => {
  await f?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

const toolbox = (id: string) => `${f.t.url}/api/toolbox/${id}/toolbox`;

/** A multipart POST of `files` (field name to content, or a text field) to a toolbox path. */
async function multipart(id: string, path: string, fields: [string, string | Blob][]): Promise<{ status: number; body: any }> {
  const form = new FormData();
  for (const [name, value] of fields) {
    if (typeof value === "string") form.append(name, value);
    else form.append(name, value, "f.bin");
  }
  const res = await fetch(`${toolbox(id)}${path}`, { method: "POST", body: form, headers: { authorization: `Bearer ${f.t.adminKey}` } });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

describe("a full disk", () => {
  it("answers 400 naming the path (not 429, which clients take for a rate limit) for uploads and every other write", async () => {
    const s = await f.create({ disk: 1 });
    const exec = (command: string) => f.call("POST", `/toolbox/${s.id}/toolbox/process/execute`, { command });
    // A repository to clone once the disk is full (it needs a few blocks the disk no longer has).
    const prep = await exec("git init -q /tmp/src && cd /tmp/src && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m one && echo ready");
    expect(prep.body.result).toContain("ready");
    // Every free block: fallocate takes what df says is available, the writes after it what ext4 still finds.
    const fill = await exec("fallocate -l $(df --output=avail -B1 ~ | tail -1) ~/fill; head -c 64M /dev/zero > ~/fill2; head -c 64M /dev/zero > ~/fill3; df --output=avail -B1 ~ | tail -1");
    expect(Number(fill.body.result.trim().split("\n").at(-1))).toBeLessThan(1 << 20);

    const content = new Blob([Buffer.alloc(4 << 20, 7)]);
    const single = await multipart(s.id, "/files/upload?path=/home/sandbar/single.bin", [["file", content]]);
    expect(single.status, JSON.stringify(single.body)).toBe(400);
    expect(single.body.message).toMatch(/^no space left on device: .*single\.bin/);

    const bulk = await multipart(s.id, "/files/bulk-upload", [["files[0].path", "/home/sandbar/bulk.bin"], ["files[0].file", content]]);
    expect(bulk.status, JSON.stringify(bulk.body)).toBe(400);
    expect(bulk.body.message).toMatch(/^no space left on device: .*bulk\.bin/);

    const folder = await f.call("POST", `/toolbox/${s.id}/toolbox/files/folder?path=/home/sandbar/a/b/c/d&mode=755`);
    expect(folder.status, JSON.stringify(folder.body)).toBe(400);
    expect(folder.body.message).toMatch(/^no space left on device: \/home\/sandbar\/a/);

    const clone = await f.call("POST", `/toolbox/${s.id}/toolbox/git/clone`, { url: "/tmp/src", path: "/home/sandbar/clone" });
    expect(clone.status, JSON.stringify(clone.body)).toBe(400);
    expect(clone.body.message).toMatch(/^no space left on device: \/home\/sandbar\/clone/);

    // The call that freed room: the next upload goes through.
    expect((await exec("rm ~/fill ~/fill2 ~/fill3 && echo freed")).body.result).toBe("freed\n");
    const ok = await multipart(s.id, "/files/upload?path=/home/sandbar/single.bin", [["file", content]]);
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});
