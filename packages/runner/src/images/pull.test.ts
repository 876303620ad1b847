import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { lstat, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { run } from "../host/command.ts";
import { ImageStore, lowers, type RegistryCredentials } from "./index.ts";
import { addImage, addIndex, initLayout, layerFromFiles, layerFromTar, rawTar, seedImages, startRegistry, type SeededImages, type TestRegistry } from "./testing/registry.ts";

// Pulls from a real registry (Debian's docker-registry on loopback, basic auth) with real skopeo.

let reg: TestRegistry;
let seeded: SeededImages;
let creds: RegistryCredentials;
let scratch: string;
let layout: string;

beforeAll(async () => {
  reg = await startRegistry();
  creds = { username: reg.username, password: reg.password };
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-images-"));
  seeded = await seedImages(reg, scratch);
  layout = path.join(scratch, "hostile");
  await initLayout(layout);
}, 60_000);

afterAll(async () => {
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

async function newStore(over: Partial<Parameters<typeof ImageStore.open>[0]> = {}): Promise<ImageStore> {
  const dataDir = over.dataDir ?? (await mkdtemp(path.join(scratch, "data-")));
  return ImageStore.open({ dataDir, ...over });
}

async function failure(p: Promise<unknown>): Promise<ConnectError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ConnectError);
  return err as ConnectError;
}

/** Pushes an image made of `tars` (raw, possibly hostile) and returns its reference. */
async function pushRaw(name: string, tars: Buffer[]): Promise<string> {
  await addImage(layout, name, { layers: tars.map(layerFromTar) });
  await reg.push(layout, name, `hostile/${name}:1`);
  return `${reg.host}/hostile/${name}:1`;
}

async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string, rel: string) => {
    for (const e of (await readdir(d, { withFileTypes: true })).sort((a, b) => a.name.localeCompare(b.name))) {
      const r = `${rel}/${e.name}`;
      out.push(e.isDirectory() ? `${r}/` : r);
      if (e.isDirectory()) await walk(path.join(d, e.name), r);
    }
  };
  await walk(dir, "");
  return out;
}

const nothingLeft = async (store: ImageStore) => {
  expect(await readdir(path.join(store.root, "tmp"))).toEqual([]);
  expect(await readdir(path.join(store.root, "images"))).toEqual([]);
  expect(await readdir(path.join(store.root, "layers"))).toEqual([]);
};

describe("pull", () => {
  it("pulls with basic auth and exposes files and the image config", async () => {
    const store = await newStore();
    const lines: string[] = [];
    const t0 = performance.now();
    const img = await store.pull(seeded.app, { credentials: creds, onProgress: (l) => lines.push(l) });
    const ms = performance.now() - t0;
    expect(await readFile(path.join(img.rootfs, "app/hello.txt"), "utf8")).toBe("hello from the image\n");
    expect(await readFile(path.join(img.rootfs, "etc/base.txt"), "utf8")).toBe("base layer\n");
    expect(img.config).toMatchObject({ env: { GREETING: "hello world", APP_MODE: "test" }, workdir: "/app", cmd: ["cat", "/app/hello.txt"], entrypoint: [], os: "linux", architecture: "amd64" });
    expect(img.layers).toHaveLength(2);
    expect(img.layers[0].diffId).toBe(seeded.baseDiffId);
    expect(img.digest).toBe(seeded.appDigest);
    expect(await store.get(seeded.app)).toMatchObject({ digest: img.digest, rootfs: img.rootfs });
    expect(await store.get(img.digest)).toMatchObject({ digest: img.digest });
    expect(lines.join("\n")).toMatch(/ready as sha256:/);
    expect(lines.join("\n")).not.toContain(reg.password);
    expect(await readdir(path.join(store.root, "tmp"))).toEqual([]);
    console.log(`pull+unpack of ${seeded.app} (2 small layers): ${ms.toFixed(0)} ms`);
  });

  it("refuses a wrong password and a missing one with a clear error that holds no secret", async () => {
    const store = await newStore();
    const wrong = await failure(store.pull(seeded.app, { credentials: { username: reg.username, password: "not-the-password" } }));
    expect(wrong.code).toBe(Code.PermissionDenied);
    expect(wrong.rawMessage).toMatch(/refused the credentials/);
    expect(wrong.rawMessage).not.toContain("not-the-password");
    expect(wrong.rawMessage).not.toContain(Buffer.from(`${reg.username}:not-the-password`).toString("base64"));
    const none = await failure(store.pull(seeded.app));
    expect(none.code).toBe(Code.PermissionDenied);
    await nothingLeft(store);
  });

  it("pins digests and says not found for unknown images, tags and digests", async () => {
    const store = await newStore();
    const repo = seeded.app.replace(/:1\.0$/, "");
    const pinned = await store.pull(`${repo}@${seeded.appDigest}`, { credentials: creds });
    expect(pinned.digest).toBe(seeded.appDigest);
    // A pinned digest on disk is served without asking the registry (it cannot have changed).
    const again = await store.pull(`${repo}@${seeded.appDigest}`, { credentials: { username: "x", password: "y" } });
    expect(again.digest).toBe(seeded.appDigest);
    for (const ref of [`${reg.host}/test/nope:1.0`, `${repo}:2.0`, `${repo}@sha256:${"0".repeat(64)}`]) {
      const err = await failure(store.pull(ref, { credentials: creds }));
      expect(err.code, ref).toBe(Code.NotFound);
      expect(err.rawMessage).toMatch(/not found/);
    }
    expect((await failure(store.pull(`${repo}:latest`))).code).toBe(Code.InvalidArgument);
  });

  it("honours whiteouts and opaque directories, and keeps layers in overlayfs form", async () => {
    const store = await newStore();
    const img = await store.pull(seeded.whiteout, { credentials: creds });
    const files = await tree(img.rootfs);
    expect(files).toContain("/data/keep");
    expect(files).not.toContain("/data/gone");
    expect(files.filter((f) => f.startsWith("/opq/") && f !== "/opq/")).toEqual(["/opq/new"]);
    const top = img.layers[2];
    expect(top.whiteouts).toEqual(["data/gone"]);
    expect(top.opaque).toEqual(["opq"]);
    const wh = await lstat(path.join(top.dir, "data/gone"));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    expect((await run("getfattr", ["--only-values", "-n", "trusted.overlay.opaque", path.join(top.dir, "opq")])).stdout).toBe("y");
    // The layer dirs are real lowerdirs: the kernel's merge equals ours.
    const mnt = await mkdtemp(path.join(scratch, "mnt-"));
    await run("mount", ["-t", "overlay", "overlay", "-o", `ro,lowerdir=${lowers(img).join(":")}`, mnt]);
    try {
      const ours = (await tree(img.rootfs)).filter((f) => !/^\/(proc|dev|sys|tmp|run)\/$/.test(f));
      expect(await tree(mnt)).toEqual(ours);
    } finally {
      await run("umount", [mnt]);
    }
  });

  it("stores a shared layer once: both images' roots link the same inode", async () => {
    const store = await newStore();
    const a = await store.pull(seeded.app, { credentials: creds });
    const b = await store.pull(seeded.whiteout, { credentials: creds });
    expect(a.layers[0].dir).toBe(b.layers[0].dir);
    const inLayer = await lstat(path.join(a.layers[0].dir, "etc/base.txt"));
    for (const img of [a, b]) expect((await lstat(path.join(img.rootfs, "etc/base.txt"))).ino).toBe(inLayer.ino);
    expect(await readdir(path.join(store.root, "layers"))).toHaveLength(4);
    // Removing one image keeps the shared layer; removing both frees everything.
    await store.remove(a.digest);
    expect(await readdir(path.join(store.root, "layers"))).toHaveLength(3);
    expect(await store.get(seeded.app)).toBeUndefined();
    // Removal waits for a running pull instead of collecting the layers it is publishing.
    const [again] = await Promise.all([store.pull(seeded.app, { credentials: creds }), store.remove(b.digest)]);
    expect(await readFile(path.join(again.rootfs, "etc/base.txt"), "utf8")).toBe("base layer\n");
    expect((await readdir(path.join(store.root, "layers"))).sort()).toEqual(a.layers.map((l) => path.basename(path.dirname(l.dir))).sort());
    await store.remove(again.digest);
    expect(await readdir(path.join(store.root, "layers"))).toEqual([]);
    expect(await readdir(path.join(store.root, "refs"))).toEqual([]);
  });

  it("chooses linux/amd64 from a multi-platform index", async () => {
    const arm = await layerFromFiles({ "arch.txt": "arm64\n" }, scratch);
    const amd = await layerFromFiles({ "arch.txt": "amd64\n" }, scratch);
    const { manifests } = await addIndex(layout, "multi", { arm64: { layers: [arm] }, amd64: { layers: [amd] } });
    await reg.push(layout, "multi", "test/multi:1.0");
    const img = await (await newStore()).pull(`${reg.host}/test/multi:1.0`, { credentials: creds });
    expect(await readFile(path.join(img.rootfs, "arch.txt"), "utf8")).toBe("amd64\n");
    expect(img.digest).toBe(manifests.amd64);
  });

  it("fetches unqualified and docker.io names from the configured mirror", async () => {
    await reg.push(seeded.layout, "app", "library/pyfake:3.12");
    const store = await newStore({ mirror: reg.host });
    const img = await store.pull("pyfake:3.12", { credentials: creds });
    expect(img.ref).toBe("docker.io/library/pyfake:3.12");
    expect(await readFile(path.join(img.rootfs, "app/hello.txt"), "utf8")).toBe("hello from the image\n");
  });
});

describe("hostile layers", () => {
  const cases: [string, Buffer, RegExp][] = [
    ["dotdot", rawTar([{ path: "../escape-dotdot", content: "x" }]), /escapes the layer/],
    ["absolute", rawTar([{ path: "/tmp/escape-absolute", content: "x" }]), /absolute path/],
    ["symlink", rawTar([{ path: "link", type: "SymbolicLink", linkpath: "/tmp" }, { path: "link/escape-symlink", content: "x" }]), /through the symbolic link link/],
    ["hardlink", rawTar([{ path: "hl", type: "Link", linkpath: "../../../../etc/passwd" }]), /escapes the layer/],
    ["device", rawTar([{ path: "dev/sda", type: "CharacterDevice" }]), /device node/],
    // A whiteout recorded under a directory that a later member turns into a symlink to the host.
    ["late-symlink", rawTar([{ path: "a/", type: "Directory" }, { path: "a/.wh.escape-late", content: "" }, { path: "a", type: "SymbolicLink", linkpath: "/tmp" }]), /no longer a directory/],
  ];
  for (const [name, tar, why] of cases) {
    it(`refuses a layer with ${name} and leaves nothing behind`, async () => {
      const ref = await pushRaw(name, [tar]);
      const store = await newStore();
      const err = await failure(store.pull(ref, { credentials: creds }));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toMatch(why);
      await nothingLeft(store);
      for (const p of ["/tmp/escape-absolute", "/tmp/escape-symlink", "/tmp/escape-late", path.join(store.root, "tmp/escape-dotdot")]) {
        expect(await lstat(p).catch(() => undefined), p).toBeUndefined();
      }
    });
  }

  it("caps uncompressed bytes and entry counts (layer bombs)", async () => {
    const big = await pushRaw("bomb-bytes", [rawTar([{ path: "zeros", content: "", size: 8 << 20 }])]);
    const many = await pushRaw("bomb-files", [rawTar(Array.from({ length: 300 }, (_, i) => ({ path: `f${i}`, content: "" })))]);
    const store = await newStore({ maxBytes: 1 << 20, maxFiles: 100 });
    const bytes = await failure(store.pull(big, { credentials: creds }));
    expect(bytes.code).toBe(Code.ResourceExhausted);
    expect(bytes.rawMessage).toMatch(/more than 1048576 bytes uncompressed/);
    const files = await failure(store.pull(many, { credentials: creds }));
    expect(files.code).toBe(Code.ResourceExhausted);
    expect(files.rawMessage).toMatch(/more than 100 files/);
    await nothingLeft(store);
  });
});

describe("concurrency and crashes", () => {
  it("does the work once for concurrent pulls, in one process and across stores", async () => {
    const dataDir = await mkdtemp(path.join(scratch, "data-"));
    const a = await newStore({ dataDir });
    const b = await newStore({ dataDir });
    let copies = 0;
    const count = { credentials: creds, onSkopeo: () => copies++ };
    const results = await Promise.all([a.pull(seeded.whiteout, count), a.pull(seeded.whiteout, count), b.pull(seeded.whiteout, count), b.pull(seeded.whiteout, count)]);
    expect(copies).toBe(1);
    expect(new Set(results.map((r) => r.rootfs)).size).toBe(1);
    expect(await readdir(path.join(a.root, "images"))).toHaveLength(1);
    expect(await readdir(path.join(a.root, "locks"))).toEqual([]);
  });

  it("a killed skopeo leaves nothing half-written and the next pull succeeds", async () => {
    const noise = await layerFromFiles({ "noise.bin": randomBytes(24 << 20) }, scratch);
    await addImage(layout, "big", { layers: [noise] });
    await reg.push(layout, "big", "test/big:1.0");
    const ref = `${reg.host}/test/big:1.0`;
    const store = await newStore();
    const err = await failure(store.pull(ref, { credentials: creds, onSkopeo: (pid) => setTimeout(() => process.kill(pid, "SIGKILL"), 30) }));
    expect(err.code).toBe(Code.Unavailable);
    expect(err.rawMessage).toMatch(/interrupted/);
    await nothingLeft(store);
    const t0 = performance.now();
    const img = await store.pull(ref, { credentials: creds });
    console.log(`pull+unpack of a 24 MiB incompressible layer: ${(performance.now() - t0).toFixed(0)} ms`);
    expect((await lstat(path.join(img.rootfs, "noise.bin"))).size).toBe(24 << 20);
  });

  it("a puller process killed midway leaves only what the next open removes", async () => {
    const dataDir = await mkdtemp(path.join(scratch, "data-"));
    const script = `
      import { ImageStore } from ${JSON.stringify(path.join(import.meta.dirname, "index.ts"))};
      const store = await ImageStore.open({ dataDir: ${JSON.stringify(dataDir)} });
      await store.pull(${JSON.stringify(`${reg.host}/test/big:1.0`)}, { credentials: ${JSON.stringify(creds)}, onSkopeo: () => console.log("skopeo") });
      console.log("done");`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", (c: Buffer) => {
        if (c.toString().includes("skopeo")) resolve();
        if (c.toString().includes("done")) reject(new Error("the pull finished before it could be killed"));
      });
      child.on("exit", () => reject(new Error("the puller exited early")));
    });
    await new Promise((r) => setTimeout(r, 50));
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
    // What it left: its temp dir and its lock, both owned by a dead pid.
    expect((await readdir(path.join(dataDir, "images", "tmp"))).length).toBeGreaterThan(0);
    const store = await newStore({ dataDir });
    expect(await readdir(path.join(store.root, "tmp"))).toEqual([]);
    expect(await readdir(path.join(store.root, "images"))).toEqual([]);
    const img = await store.pull(`${reg.host}/test/big:1.0`, { credentials: creds });
    expect((await lstat(path.join(img.rootfs, "noise.bin"))).size).toBe(24 << 20);
  });
});

describe("token auth", () => {
  it("follows the registry's Bearer challenge to its token service (Docker Hub's scheme)", async () => {
    const tokenReg = await startRegistry({ auth: "token" });
    try {
      const anonymous = await fetch(`http://${tokenReg.host}/v2/`);
      expect(anonymous.headers.get("www-authenticate")).toMatch(/^Bearer realm="http:\/\/127\.0\.0\.1:\d+\/token",service="sandbar-test-registry"/);
      const seededHere = await seedImages(tokenReg, await mkdtemp(path.join(scratch, "tok-")));
      const store = await newStore();
      const img = await store.pull(seededHere.app, { credentials: { username: tokenReg.username, password: tokenReg.password } });
      expect(await readFile(path.join(img.rootfs, "app/hello.txt"), "utf8")).toBe("hello from the image\n");
      const err = await failure(store.pull(seededHere.whiteout, { credentials: { username: tokenReg.username, password: "wrong" } }));
      expect(err.code).toBe(Code.PermissionDenied);
    } finally {
      await tokenReg.stop();
    }
  });
});
