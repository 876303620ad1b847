import { mkdir, mkdtemp, open, readdir, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DiskImagePool } from "./disk-pool.ts";
import { unmount } from "../host/mounts.ts";
import { mountDiskImage } from "./mounts.ts";

// The pool of formatted disk images, with real mkfs.ext4 on sparse files in a scratch dir.

const MiB = 2 ** 20;
const dirs: string[] = [];
const pools: DiskImagePool[] = [];

async function scratch(): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), "sandbar-disk-pool-"));
  dirs.push(d);
  return d;
}

async function openPool(dir: string, o: Parameters<typeof DiskImagePool.open>[1] = {}): Promise<DiskImagePool> {
  const p = await DiskImagePool.open(dir, { refillDelayMs: 0, ...o });
  pools.push(p);
  return p;
}

afterEach(async () => {
  for (const p of pools.splice(0)) await p.close();
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

/** The ext4 superblock's magic and UUID (a whole filesystem has both; each mkfs draws a new UUID). */
async function ext4(image: string): Promise<{ magic: number; uuid: string; size: number }> {
  const fh = await open(image, "r");
  try {
    const sb = Buffer.alloc(1024);
    await fh.read(sb, 0, 1024, 1024);
    return { magic: sb.readUInt16LE(0x38), uuid: sb.subarray(0x68, 0x78).toString("hex"), size: (await fh.stat()).size };
  } finally {
    await fh.close();
  }
}

const ready = async (pool: DiskImagePool, bytes: number) => (await readdir(path.join(pool.dir, String(bytes))).catch(() => [] as string[])).filter((n) => !n.startsWith("."));

describe("disk image pool", () => {
  it("formats in place when empty, refills to perSize in the background, then hands out ready images", async () => {
    const d = await scratch();
    const pool = await openPool(path.join(d, "pool"), { perSize: 2 });
    const first = path.join(d, "a.img");
    await pool.claim(first, 64 * MiB);
    expect(await ext4(first)).toMatchObject({ magic: 0xef53, size: 64 * MiB });
    await pool.idle();
    expect(await ready(pool, 64 * MiB)).toHaveLength(2);

    const second = path.join(d, "b.img");
    await pool.claim(second, 64 * MiB);
    expect(await ready(pool, 64 * MiB)).toHaveLength(1); // taken from the pool, not formatted
    expect(await ext4(second)).toMatchObject({ magic: 0xef53, size: 64 * MiB });
    expect((await ext4(second)).uuid).not.toBe((await ext4(first)).uuid);
    await pool.idle();
    expect(await ready(pool, 64 * MiB)).toHaveLength(2);
  });

  it("never hands one image to two claims, even from two pools (runner processes) on one directory", async () => {
    const d = await scratch();
    const a = await openPool(path.join(d, "pool"), { perSize: 3 });
    await a.claim(path.join(d, "seed.img"), 32 * MiB);
    await a.idle();
    await a.close();
    const b = await openPool(path.join(d, "pool"), { perSize: 3, refillDelayMs: 60_000 });
    const c = await openPool(path.join(d, "pool"), { perSize: 3, refillDelayMs: 60_000 });
    await Promise.all([b.idle(), c.idle()]); // open refills at once: both find the pool full
    expect(await ready(b, 32 * MiB)).toHaveLength(3);
    const targets = Array.from({ length: 8 }, (_, i) => path.join(d, `t${i}.img`));
    await Promise.all(targets.map((t, i) => (i % 2 ? b : c).claim(t, 32 * MiB)));
    const inodes = await Promise.all(targets.map(async (t) => (await stat(t)).ino));
    const uuids = await Promise.all(targets.map(async (t) => (await ext4(t)).uuid));
    expect(new Set(inodes).size).toBe(8);
    expect(new Set(uuids).size).toBe(8);
    expect(await ready(b, 32 * MiB)).toHaveLength(0);
  });

  it("stays bounded: perSize images for the last maxSizes sizes", async () => {
    const d = await scratch();
    const pool = await openPool(path.join(d, "pool"), { perSize: 1, maxSizes: 2 });
    for (const [i, mib] of [16, 24, 32].entries()) {
      await pool.claim(path.join(d, `s${i}.img`), mib * MiB);
      await pool.idle();
    }
    expect((await readdir(pool.dir)).sort()).toEqual([String(24 * MiB), String(32 * MiB)]);
    expect(await ready(pool, 24 * MiB)).toHaveLength(1);
    expect(await ready(pool, 32 * MiB)).toHaveLength(1);
    await pool.claim(path.join(d, "again.img"), 16 * MiB); // asked again: the least recent size goes
    await pool.idle();
    expect((await readdir(pool.dir)).sort()).toEqual([String(16 * MiB), String(32 * MiB)]);
  });

  it("open removes a crash's half-made images and stray names, keeps whole ones, refills", async () => {
    const d = await scratch();
    const dir = path.join(d, "pool");
    const first = await openPool(dir, { perSize: 2 });
    await first.claim(path.join(d, "x.img"), 16 * MiB);
    await first.idle();
    await first.close();
    const sizeDir = path.join(dir, String(16 * MiB));
    const whole = await ready(first, 16 * MiB);
    expect(whole).toHaveLength(2);
    const wholeUuids = await Promise.all(whole.map(async (n) => (await ext4(path.join(sizeDir, n))).uuid));
    await writeFile(path.join(sizeDir, ".0123456789abcdef.img"), "half"); // mkfs cut short by a crash
    await writeFile(path.join(sizeDir, "notes.txt"), "?");
    await mkdir(path.join(dir, "junk"));
    const reopened = await openPool(dir, { perSize: 2 });
    expect((await readdir(dir)).sort()).toEqual([String(16 * MiB)]);
    expect((await readdir(sizeDir)).sort()).toEqual([...whole].sort());
    await reopened.claim(path.join(d, "y.img"), 16 * MiB);
    expect(wholeUuids).toContain((await ext4(path.join(d, "y.img"))).uuid); // one kept from before the "crash"
    await reopened.idle();
    expect(await ready(reopened, 16 * MiB)).toHaveLength(2);
  });

  it("perSize 0 keeps nothing and empties what an earlier run left", async () => {
    const d = await scratch();
    const dir = path.join(d, "pool");
    const on = await openPool(dir, { perSize: 1 });
    await on.claim(path.join(d, "a.img"), 16 * MiB);
    await on.idle();
    await on.close();
    const off = await openPool(dir, { perSize: 0 });
    expect(await readdir(dir)).toEqual([]);
    await off.claim(path.join(d, "b.img"), 16 * MiB);
    expect(await ext4(path.join(d, "b.img"))).toMatchObject({ magic: 0xef53 });
    await off.idle();
    expect(await readdir(dir)).toEqual([]);
  });

  it("turns itself off when the sandboxes are on another filesystem (rename cannot cross it)", async () => {
    const d = await scratch(); // on the root filesystem; the pool on tmpfs
    const shm = await mkdtemp(path.join("/dev/shm", "sandbar-disk-pool-"));
    dirs.push(shm);
    const lines: string[] = [];
    const pool = await openPool(path.join(shm, "pool"), { perSize: 1, log: (l) => lines.push(l) });
    await pool.claim(path.join(shm, "seed.img"), 16 * MiB);
    await pool.idle();
    expect(await ready(pool, 16 * MiB)).toHaveLength(1);
    await pool.claim(path.join(d, "a.img"), 16 * MiB);
    expect(await ext4(path.join(d, "a.img"))).toMatchObject({ magic: 0xef53, size: 16 * MiB });
    expect(lines.join("\n")).toContain("turned off");
    await pool.claim(path.join(d, "b.img"), 16 * MiB);
    await pool.idle();
    expect(await ready(pool, 16 * MiB)).toHaveLength(1); // untouched, no refill
  });

  it("images come with the overlay's upper (0755) and work (0700) dirs, and leave no template behind", async () => {
    const d = await scratch();
    const pool = await openPool(path.join(d, "pool"), { perSize: 1 });
    const inPlace = path.join(d, "a.img");
    await pool.claim(inPlace, 16 * MiB); // formatted for the claim
    await pool.idle();
    const pooled = path.join(d, "b.img");
    await pool.claim(pooled, 16 * MiB); // formatted by a refill
    await pool.idle();
    expect((await readdir(d)).sort()).toEqual(["a.img", "b.img", "pool"]);
    expect(await readdir(path.join(pool.dir, String(16 * MiB)))).toHaveLength(1);
    for (const image of [inPlace, pooled]) {
      const at = path.join(d, "mnt");
      await mkdir(at, { recursive: true });
      await mountDiskImage(image, at, true);
      try {
        const modes = await Promise.all(["upper", "work"].map(async (n) => (await stat(path.join(at, n))).mode & 0o7777));
        expect(modes).toEqual([0o755, 0o700]);
      } finally {
        await unmount(at);
      }
    }
  });

  it("close stops refilling", async () => {
    const d = await scratch();
    // The delay outlasts the claim's own mkfs even on a loaded machine (at 100 ms it did not always).
    const pool = await openPool(path.join(d, "pool"), { perSize: 2, refillDelayMs: 400 });
    await pool.claim(path.join(d, "a.img"), 16 * MiB);
    await pool.close();
    await new Promise((r) => setTimeout(r, 600));
    expect(await ready(pool, 16 * MiB)).toHaveLength(0);
  });
});
