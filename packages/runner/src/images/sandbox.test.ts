import { readFile, rm, mkdtemp } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Fixture } from "../linux/testing/harness.ts";
import { fixture, sh, uniqueId } from "../linux/testing/harness.ts";
import { ImageStore, sandboxSpecFor, type Image } from "./index.ts";
import { layerFromDir, seedImages, startRegistry, type TestRegistry } from "./testing/registry.ts";

// A sandbox booted by the linux provider from a pulled image's root. The images' base layer is
// the harness's host-/usr skeleton (the sandbox binds the host's /usr, where node's libraries
// live); the image's own files and env must be what the command sees.

let f: Fixture;
let reg: TestRegistry;
let scratch: string;
let app: Image;
let whiteout: Image;
const created: string[] = [];

beforeAll(async () => {
  f = await fixture();
  reg = await startRegistry();
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-images-sbx-"));
  const seeded = await seedImages(reg, scratch, await layerFromDir(f.rootfs));
  const store = await ImageStore.open({ dataDir: f.dataDir });
  const credentials = { username: reg.username, password: reg.password };
  app = await store.pull(seeded.app, { credentials });
  whiteout = await store.pull(seeded.whiteout, { credentials });
}, 120_000);

afterAll(async () => {
  for (const id of created) await f?.provider.destroy(id).catch(() => undefined);
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

async function boot(image: Image, env: Record<string, string> = {}): Promise<string> {
  const id = uniqueId("img");
  await f.provider.create(sandboxSpecFor(image, { ...f.spec(id), env }));
  created.push(id);
  await f.provider.start(id);
  return id;
}

describe("sandbox from an image", () => {
  it("sees the image's files and env (the caller's env wins), and cannot change the image", async () => {
    const id = await boot(app, { APP_MODE: "override" });
    const r = await sh(f.provider, id, 'cat /app/hello.txt /etc/greeting; echo "$GREETING|$APP_MODE"; echo changed >> /app/notes.txt && cat /app/notes.txt');
    expect(r.stderr).toBe("");
    expect(r.stdout).toBe("hello from the image\nhi\nhello world|override\nnotes\nchanged\n");
    // The write went to the sandbox's upper dir, not into the shared layer or the image root.
    expect(await readFile(path.join(app.rootfs, "app/notes.txt"), "utf8")).toBe("notes\n");
    expect(await readFile(path.join(app.layers[1].dir, "app/notes.txt"), "utf8")).toBe("notes\n");
  });

  it("does not see deleted files or the hidden contents of opaque directories", async () => {
    const id = await boot(whiteout);
    const r = await sh(f.provider, id, "ls /data /opq; test -e /data/gone && echo present || echo absent");
    expect(r.stdout).toBe("/data:\nkeep\n\n/opq:\nnew\nabsent\n");
  });
});
