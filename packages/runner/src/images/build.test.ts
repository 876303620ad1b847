import { chmod, copyFile, mkdir, mkdtemp, readFile, realpath, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BuildFailed, fromRegistries, ImageStore } from "./index.ts";
import { addImage, initLayout, layerFromDir, startRegistry, type TestRegistry } from "./testing/registry.ts";

// Declarative builds with the real buildah (root, vfs, chroot isolation, no network) from a FROM
// image on a loopback registry with basic auth, into the image store. Run as root.

let reg: TestRegistry;
let scratch: string;
let store: ImageStore;
let base: string;

/** A base image with a shell: dash, cat and glibc from this host. */
async function pushShellImage(): Promise<string> {
  const root = path.join(scratch, "userland");
  for (const f of ["/lib64/ld-linux-x86-64.so.2", "/bin/sh", "/bin/cat", "/lib/x86_64-linux-gnu/libc.so.6"]) {
    await mkdir(path.join(root, path.dirname(f)), { recursive: true });
    await copyFile(await realpath(f), path.join(root, f));
  }
  await mkdir(path.join(root, "tmp"));
  await chmod(path.join(root, "tmp"), 0o1777);
  const layout = path.join(scratch, "layout");
  await initLayout(layout);
  await addImage(layout, "base", { layers: [await layerFromDir(root)], env: ["PATH=/bin"], workdir: "/", entrypoint: ["/bin/sh"] });
  await reg.push(layout, "base", "build/base:1.0");
  return `${reg.host}/build/base:1.0`;
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-build-"));
  reg = await startRegistry();
  base = await pushShellImage();
  store = await ImageStore.open({ dataDir: path.join(scratch, "data") });
}, 120_000);

afterAll(async () => {
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

const credentials = () => ({ [reg.host]: { username: reg.username, password: reg.password } });

describe("declarative builds", () => {
  it("names the registries FROM lines pull from (the mirror for Docker Hub), skipping stages", () => {
    expect(fromRegistries("FROM python:3.12 AS b\nFROM b\nFROM ghcr.io/a/b:1\nFROM scratch\n", "mirror:5000")).toEqual(["mirror:5000", "ghcr.io"]);
  });

  it("builds FROM + RUN + COPY from the context + ENV/WORKDIR/ENTRYPOINT, then reuses the build", async () => {
    const lines: string[] = [];
    const dockerfile = `FROM ${base}\nRUN echo built > /built.txt\nCOPY /home/me/app.txt /srv/app.txt\nENV MODE=built\nWORKDIR /srv\nENTRYPOINT ["/bin/sh", "-c", "sleep 1"]\n`;
    const image = await store.build("k1", {
      dockerfile,
      credentials: credentials(),
      context: async (dir) => {
        await mkdir(path.join(dir, "home/me"), { recursive: true });
        await writeFile(path.join(dir, "home/me/app.txt"), "from the context\n");
      },
      onProgress: (l) => lines.push(l),
    });
    expect(await readFile(path.join(image.rootfs, "built.txt"), "utf8")).toBe("built\n");
    expect(await readFile(path.join(image.rootfs, "srv/app.txt"), "utf8")).toBe("from the context\n");
    expect(image.config.env).toMatchObject({ MODE: "built", PATH: "/bin" });
    expect(image.config.workdir).toBe("/srv");
    expect(image.config.entrypoint).toEqual(["/bin/sh", "-c", "sleep 1"]);
    expect(lines.join("\n")).toMatch(/RUN echo built/);

    // Same key: no build (the context is never read), the same image.
    const again: string[] = [];
    const cached = await store.build("k1", { dockerfile, credentials: credentials(), context: async () => { throw new Error("not called"); }, onProgress: (l) => again.push(l) });
    expect(cached.digest).toBe(image.digest);
    expect(again).toEqual([`build k1 is cached as ${image.digest}`]);
  }, 180_000);

  it("runs concurrent builds of one key once", async () => {
    let contexts = 0;
    const o = { dockerfile: `FROM ${base}\nRUN echo two > /two.txt\n`, credentials: credentials(), context: async () => void contexts++ };
    const [a, b] = await Promise.all([store.build("k2", o), store.build("k2", o)]);
    expect(a.digest).toBe(b.digest);
    expect(contexts).toBe(1);
  }, 180_000);

  it("fails a failing RUN with the builder's last lines, and a FROM the registry refuses", async () => {
    const err = await store.build("k3", { dockerfile: `FROM ${base}\nRUN echo about to fail && exit 7\n`, credentials: credentials(), context: async () => undefined }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BuildFailed);
    expect((err as Error).message).toMatch(/exit status 7|exit 7/);
    expect(await store.built("k3")).toBeUndefined();
    const denied = await store.build("k4", { dockerfile: `FROM ${base}\n`, credentials: {}, context: async () => undefined }).catch((e: unknown) => e);
    expect(denied).toBeInstanceOf(BuildFailed);
    expect((denied as Error).message).toMatch(/unauthorized|authentication required/i);
  }, 180_000);
});
