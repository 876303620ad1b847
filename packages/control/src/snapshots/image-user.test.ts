import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { pushTestImage, registryAccount } from "./testing/image.ts";

// An image's USER applied to its sandboxes: real registry on loopback (basic auth), images built
// here from files with a passwd entry and USER by name or by uid, real sandboxes (root).

let t: TestServer;
let reg: TestRegistry;
let scratch: string;
let bundle: string;
const call = (verb: string, p: string, body?: unknown) => api(t.url, t.adminKey, verb, p, body);

const PASSWD = { "etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n", "etc/group": "root:x:0:\napp:x:1001:\n", "home/app/.profile": "# app\n" };

async function snapshotOf(name: string, image: string): Promise<void> {
  const made = await call("POST", "/snapshots", { name, imageName: image });
  expect(made.status, JSON.stringify(made.body)).toBe(200);
  const until = Date.now() + 60_000;
  for (;;) {
    const r = await call("GET", `/snapshots/${made.body.id}`);
    if (r.body.state === "active") return;
    if (r.body.state === "error" || Date.now() > until) throw new Error(`snapshot ${name}: ${r.body.state} ${r.body.errorReason}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

const WHO = 'echo "$(id -u):$(id -g):$(id -un):$HOME:$USER"; : > "$HOME/written" && echo home-writable';

async function whoIn(body: Record<string, unknown>): Promise<{ user: string; out: string }> {
  const s = await call("POST", "/sandbox", body);
  expect(s.status, JSON.stringify(s.body)).toBe(200);
  const r = await call("POST", `/toolbox/${s.body.id}/toolbox/process/execute`, { command: WHO });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  expect((await call("DELETE", `/sandbox/${s.body.id}`)).status).toBe(200);
  return { user: s.body.user, out: r.body.result };
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-image-user-"));
  reg = await startRegistry();
  const push = async (dir: string, repo: string, user: string) => {
    await import("node:fs/promises").then((fs) => fs.mkdir(path.join(scratch, dir)));
    return pushTestImage(reg, path.join(scratch, dir), repo, { user, files: PASSWD });
  };
  const byName = await push("a", "test/user-name:1.0", "app");
  const byUid = await push("b", "test/user-uid:1.0", "1001:1001");
  const unknown = await push("c", "test/user-unknown:1.0", "4242");
  bundle = await buildAgentBundle("sandbar-image-user-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle }, control: { registryCredentials: registryAccount(reg) } });
  await snapshotOf("user-name", byName);
  await snapshotOf("user-uid", byUid);
  await snapshotOf("user-unknown", unknown);
}, 180_000);

afterAll(async () => {
  await t?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

describe("the image's USER", () => {
  it("runs a sandbox's processes as the image's USER given by name, with its passwd uid, gid and home", async () => {
    expect(await whoIn({ snapshot: "user-name" })).toEqual({ user: "app", out: "1001:1001:app:/home/app:app\nhome-writable\n" });
  }, 120_000);

  it("resolves a numeric USER through the image's /etc/passwd", async () => {
    expect(await whoIn({ snapshot: "user-uid" })).toEqual({ user: "app", out: "1001:1001:app:/home/app:app\nhome-writable\n" });
  }, 120_000);

  it("yields to the request's user", async () => {
    expect(await whoIn({ snapshot: "user-name", user: "sandbar" })).toEqual({ user: "sandbar", out: "1000:1000:sandbar:/home/sandbar:sandbar\nhome-writable\n" });
    expect(await whoIn({ snapshot: "user-uid", user: "root" })).toEqual({ user: "root", out: "0:0:root:/root:root\nhome-writable\n" });
  }, 120_000);

  it("refuses with 400 a numeric USER the image's passwd does not name, unless the request names a user", async () => {
    const r = await call("POST", "/sandbox", { snapshot: "user-unknown" });
    expect(r.status).toBe(400);
    expect(r.body.message).toBe("The image's USER 4242 has no entry in its /etc/passwd: set user in the request");
    expect((await whoIn({ snapshot: "user-unknown", user: "sandbar" })).out).toBe("1000:1000:sandbar:/home/sandbar:sandbar\nhome-writable\n");
  }, 120_000);
});
