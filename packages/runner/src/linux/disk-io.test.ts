import { mkdir, mkdtemp, readdir, readFile, rm, symlink } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { unmount } from "../host/mounts.ts";
import { mountDiskImage } from "./mounts.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// The loop device under a disk-capped sandbox's image does direct I/O (no second copy of the
// sandbox's writes in the host's cache of the image file), from its first start, after a
// stop/start and after the disk grew; the files written through it read back the same.

let f: Fixture;
const created: string[] = [];

beforeAll(async () => {
  f = await fixture();
});

afterAll(() => disposeFixture(f, created));

/** The loop device mounted at the sandbox's disk mount point, from the kernel's mount table. */
async function loopOf(id: string): Promise<string> {
  const target = f.provider.layout.diskMount(id);
  for (const line of (await readFile("/proc/self/mountinfo", "utf8")).split("\n")) {
    const [fields, after] = line.split(" - ");
    if (after && fields.split(" ")[4] === target) return after.split(" ")[1];
  }
  throw new Error(`nothing mounted at ${target}`);
}

const dio = async (dev: string) => (await readFile(`/sys/block/${dev.replace("/dev/", "")}/loop/dio`, "utf8")).trim();

describe("sandbox disk I/O", () => {
  it("a disk-capped sandbox's loop device does direct I/O at start, after a restart and after the disk grew; files survive", async () => {
    const id = uniqueId("dio");
    created.push(id);
    await f.provider.create(f.spec(id, { diskGiB: 0.25 }));
    await f.provider.start(id);
    expect(await dio(await loopOf(id))).toBe("1");

    // More than the sandbox's page cache would hold back: the bytes go through the device.
    const write = await sh(f.provider, id, "head -c 150M /dev/urandom > ~/keep && sync && sha256sum ~/keep", 60_000);
    expect(write.stderr).toBe("");
    const sum = write.stdout;
    expect(sum).toMatch(/^[0-9a-f]{64} /);

    await f.provider.stop(id);
    await f.provider.start(id);
    expect(await dio(await loopOf(id))).toBe("1");
    expect((await sh(f.provider, id, "sha256sum ~/keep", 60_000)).stdout).toBe(sum);

    await f.provider.stop(id);
    await f.provider.resize(id, { diskGiB: 0.5 });
    await f.provider.start(id);
    expect(await dio(await loopOf(id))).toBe("1");
    const after = await sh(f.provider, id, "head -c 200M /dev/zero > ~/big; echo rc=$?; sha256sum ~/keep", 60_000);
    expect(after.stderr).toBe("");
    expect(after.stdout).toBe(`rc=0\n${sum}`);
  }, 180_000);

  it("an image already attached is given its device, never a second one, even through a path with a symlink; the device goes with the last unmount", async () => {
    const id = uniqueId("overlap");
    created.push(id);
    await f.provider.create(f.spec(id, { diskGiB: 0.25 }));
    await f.provider.start(id); // the disk mounted at its usual place
    const dev = await loopOf(id);
    const image = f.provider.layout.diskImage(id);
    const backing = async () => {
      const out: string[] = [];
      for (const d of await readdir("/sys/block")) {
        const b = await readFile(`/sys/block/${d}/loop/backing_file`, "utf8").catch(() => "");
        if (b.trim() === image) out.push(`/dev/${d}`);
      }
      return out;
    };
    expect(await backing()).toEqual([dev]);
    // A second mount of the same image (a pack's, say), named through a symlinked directory.
    const scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-overlap-"));
    try {
      await symlink(path.dirname(image), path.join(scratch, "via"));
      await mkdir(path.join(scratch, "mnt"));
      await mountDiskImage(path.join(scratch, "via", path.basename(image)), path.join(scratch, "mnt"));
      try {
        const again = (await readFile("/proc/self/mountinfo", "utf8")).split("\n").find((l) => l.split(" ")[4] === path.join(scratch, "mnt"));
        expect(again?.split(" - ")[1]?.split(" ")[1]).toBe(dev);
        expect(await backing()).toEqual([dev]);
        expect(await sh(f.provider, id, "echo seen > ~/through-the-device && sync && echo ok").then((r) => r.stdout)).toBe("ok\n");
      } finally {
        await unmount(path.join(scratch, "mnt"));
      }
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
    await f.provider.stop(id);
    expect(await backing()).toEqual([]);
  }, 60_000);
});
