import { randomBytes } from "node:crypto";
import { readdir, readFile, rm } from "node:fs/promises";
import http from "node:http";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import type { UntypedJson } from "../casts.ts";

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
async function multipart(id: string, path: string, fields: [string, string | Blob][]): Promise<{ status: number; body: UntypedJson }> {
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

describe("a fork bomb", () => {
  const BOMB = "bash -c ':(){ :|:& };:'";
  const saturated = async (id: string) => (await f.call("GET", `/sandbox/${id}`)).body.health?.pidsSaturated === true;

  it("shows as saturation in the sandbox's health; kill-all ends it, the next execution answers, sessions get a new shell", async () => {
    const s = await f.create({});
    const tb = `/toolbox/${s.id}/toolbox`;
    expect((await f.call("POST", `${tb}/process/session`, { sessionId: "work" })).status).toBe(201);
    expect((await f.call("POST", `${tb}/process/session/work/exec`, { command: "echo before" })).body.output).toBe("before\n");
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.health.pidsSaturated).toBe(false);

    expect((await f.call("POST", `${tb}/process/execute`, { command: BOMB })).status).toBe(200);
    await eventually("the sandbox's health to say its processes are saturated", () => saturated(s.id), 60_000);

    const killed = await f.call("POST", `${tb}/process/kill-all`, {});
    expect(killed.status, JSON.stringify(killed.body)).toBe(200);
    expect(killed.body.killed).toBeGreaterThan(100);
    // Answered once the bomb is gone: the next execution starts as on an idle sandbox.
    const ok = await f.call("POST", `${tb}/process/execute`, { command: "echo ok", timeout: 30 });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect(ok.body).toEqual({ exitCode: 0, result: "ok\n" });
    const health = (await f.call("GET", `/sandbox/${s.id}`)).body.health;
    expect(health).toMatchObject({ pidsSaturated: false, agentRunning: true, agentRestarts: 0 });
    expect(health.pids).toBeLessThan(50);
    // The session's shell was a user process too: the session goes on in a new one, its log kept.
    const after = await f.call("POST", `${tb}/process/session/work/exec`, { command: "echo after" });
    expect(after.status, JSON.stringify(after.body)).toBe(200);
    expect(after.body.output).toBe("after\n");
    expect((await f.call("GET", `${tb}/process/session/work`)).body.commands.map((c: { command: string }) => c.command)).toEqual(["echo before", "echo after"]);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("kill -9 -1 from a session ends it too (and the agent, same uid: its init restarts it)", async () => {
    const s = await f.create({});
    const tb = `/toolbox/${s.id}/toolbox`;
    expect((await f.call("POST", `${tb}/process/execute`, { command: BOMB })).status).toBe(200);
    await eventually("the sandbox's health to say its processes are saturated", () => saturated(s.id), 60_000);
    // A session made during the bomb: its shell starts from the agent's reserve, kill is a builtin.
    expect((await f.call("POST", `${tb}/process/session`, { sessionId: "s" })).status).toBe(201);
    // Accepted at once; the shell runs it once it gets the CPU its thousands of siblings share.
    await f.call("POST", `${tb}/process/session/s/exec`, { command: "kill -9 -1", runAsync: true });
    // kill(-1) is atomic against forks: everything goes at once (the init then reaps thousands).
    await eventually("the bomb to be gone", async () => {
      const h = (await f.call("GET", `/sandbox/${s.id}`)).body.health;
      return h.agentRestarts >= 1 && h.pids < 50 && !h.pidsSaturated;
    }, 120_000);
    await eventually("an execution to answer", async () => (await f.call("POST", `${tb}/process/execute`, { command: "echo ok", timeout: 30 })).body?.result === "ok\n", 30_000);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});

/**
 * A bulk upload that sends its first `mib` MiB (of a declared 64) and then waits: the agent is
 * mid-upload until `hangUp`.
 */
function stalledUpload(id: string, dest: string, mib: number): { hangUp: () => void } {
  const boundary = "----stall" + randomBytes(8).toString("hex");
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n${dest}\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="f.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const url = new URL(`${toolbox(id)}/files/bulk-upload`);
  const req = http.request({
    host: url.hostname,
    port: url.port,
    method: "POST",
    path: url.pathname,
    headers: { authorization: `Bearer ${f.t.adminKey}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": head.length + (64 << 20) + 100 },
  });
  req.on("error", () => undefined);
  req.write(head);
  for (let i = 0; i < mib; i++) req.write(randomBytes(1 << 20));
  return { hangUp: () => req.destroy() };
}

describe("uploads are atomic", () => {
  it("an agent killed mid-upload leaves no partial file and an existing file as it was; the next agent removes the temporary files", async () => {
    const s = await f.create({});
    const exec = (command: string) => f.call("POST", `/toolbox/${s.id}/toolbox/process/execute`, { command });
    expect((await exec("printf 'the old content' > ~/kept.bin && echo ok")).body.result).toBe("ok\n");
    // The sandbox's home as the host sees it (through the sandbox's root mount).
    const home = path.join(f.runtime.provider.layout.rootMount(s.id), "home/sandbar");
    const temps = async () => (await readdir(home)).filter((n) => n.includes(".sandbar-upload-"));
    const uploads = [stalledUpload(s.id, "/home/sandbar/kept.bin", 4), stalledUpload(s.id, "/home/sandbar/new.bin", 4)];
    await eventually("both uploads to be under way", async () => (await temps()).length === 2);

    const agent = await agentPid(s.id);
    process.kill(agent, "SIGKILL");
    for (const u of uploads) u.hangUp();
    // The supervisor restarts the agent; the new one removes what the killed one's uploads left.
    await eventually("the agent to answer again", async () => (await exec("echo back")).body?.result === "back\n");
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.health.agentRestarts).toBe(1);
    await eventually("the temporary files to go", async () => (await temps()).length === 0);
    expect(await readFile(path.join(home, "kept.bin"), "utf8")).toBe("the old content");
    expect((await readdir(home)).includes("new.bin")).toBe(false);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});

/** Host pid of a sandbox's agent: the child of its init (pid 1 inside) that runs the sandbox's node. */
async function agentPid(id: string): Promise<number> {
  const pids = await f.runtime.provider.cgroups.agentPids(id);
  const status = async (pid: number) => readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  let init: number | undefined;
  for (const pid of pids) if (/^NSpid:\s+\d+\s+1\s*$/m.test(await status(pid))) init = pid;
  for (const pid of pids) {
    const parent = Number(/^PPid:\s+(\d+)/m.exec(await status(pid))?.[1]);
    if (parent === init && (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).startsWith("/opt/sandbar/bin/node\0")) return pid;
  }
  throw new Error(`no agent process in sandbox ${id}`);
}
