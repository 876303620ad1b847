import { lstat, mkdir, mkdtemp, readdir, readFile, rm, writeFile, chown } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { run } from "../host/command.ts";
import { exportImage, ImageStore, type RegistryCredentials } from "./index.ts";
import { startRegistry, type TestRegistry } from "./testing/registry.ts";

// An upper-like directory (a whiteout, an opaque directory, files of a sandbox's host uid) over a
// base, exported as an OCI image to a real registry with real skopeo, then pulled back into an
// image store: what the layers held comes back, whiteouts and opaque directories included, owners
// mapped; the base's blob is made once. Run as root (mknod, trusted.* xattrs, chown).

const root = process.getuid?.() === 0;
const HOST_UID = 1_700_123_456;
let reg: TestRegistry;
let creds: RegistryCredentials;
let scratch: string;

beforeAll(async () => {
  if (!root) return;
  reg = await startRegistry();
  creds = { username: reg.username, password: reg.password };
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-export-"));
}, 60_000);

afterAll(async () => {
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

const config = { env: { PATH: "/usr/bin:/bin", MODE: "x" }, workdir: "/work", user: "1000", entrypoint: ["/bin/sh"], cmd: ["-c", "true"], labels: {} };

describe.skipIf(!root)("exportImage", () => {
  it("pushes base and captured layers; pulled back, they hold the files, the whiteout, the opaque directory, the mapped owners and the config", async () => {
    const base = path.join(scratch, "base");
    await mkdir(path.join(base, "etc"), { recursive: true });
    await mkdir(path.join(base, "dir/sub"), { recursive: true });
    await writeFile(path.join(base, "etc/gone"), "base\n");
    await writeFile(path.join(base, "dir/sub/old"), "old\n");
    await writeFile(path.join(base, "kept"), "kept\n");
    const upper = path.join(scratch, "upper");
    await mkdir(path.join(upper, "etc"), { recursive: true });
    await run("mknod", [path.join(upper, "etc/gone"), "c", "0", "0"]);
    await mkdir(path.join(upper, "dir"));
    await run("setfattr", ["-n", "trusted.overlay.opaque", "-v", "y", path.join(upper, "dir")]);
    await writeFile(path.join(upper, "dir/new"), "new\n");
    await chown(path.join(upper, "dir/new"), HOST_UID, HOST_UID);
    const big = Buffer.alloc(3 * 1024 * 1024, 7);
    await writeFile(path.join(upper, "big"), big);

    const cacheDir = path.join(scratch, "cache");
    const layers = [{ dir: base, cacheKey: "base-1" }, { dir: upper, owner: { from: HOST_UID, to: { uid: 1000, gid: 1000 } } }];
    const tmp = await mkdtemp(path.join(scratch, "tmp-"));
    const out = await exportImage({ layers, config, cacheDir, tmp, push: { image: `${reg.host}/org/snap:v1`, credentials: creds } });
    expect(out).toMatchObject({ layers: 2, digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) });

    const store = await ImageStore.open({ dataDir: path.join(scratch, "data") });
    const image = await store.pull(`${reg.host}/org/snap@${out.digest}`, { credentials: creds });
    expect(image.digest).toBe(out.digest);
    expect(image.layers[1]).toMatchObject({ whiteouts: ["etc/gone"], opaque: ["dir"] });
    expect(image.config).toMatchObject({ env: { PATH: "/usr/bin:/bin", MODE: "x" }, workdir: "/work", user: "1000", entrypoint: ["/bin/sh"], cmd: ["-c", "true"] });
    const r = image.rootfs;
    expect(await readFile(path.join(r, "kept"), "utf8")).toBe("kept\n");
    expect(await readFile(path.join(r, "dir/new"), "utf8")).toBe("new\n");
    expect((await readFile(path.join(r, "big"))).equals(big)).toBe(true);
    expect(await lstat(path.join(r, "etc/gone")).catch(() => undefined)).toBeUndefined();
    expect(await readdir(path.join(r, "dir"))).toEqual(["new"]);
    expect(await lstat(path.join(r, "dir/new"))).toMatchObject({ uid: 1000, gid: 1000 });

    // A second export over the same base: its blob comes from the cache (made once), the top is new.
    const blobs = (await readdir(cacheDir)).filter((n) => /^[0-9a-f]{64}$/.test(n));
    expect(blobs).toHaveLength(1);
    await writeFile(path.join(upper, "more"), "more\n");
    const tmp2 = await mkdtemp(path.join(scratch, "tmp-"));
    const again = await exportImage({ layers, config, cacheDir, tmp: tmp2, push: { image: `${reg.host}/org/snap2:v1`, credentials: creds } });
    expect(again.digest).not.toBe(out.digest);
    expect((await readdir(cacheDir)).filter((n) => /^[0-9a-f]{64}$/.test(n))).toEqual(blobs);
  }, 120_000);
});
