import { readFile } from "node:fs/promises";
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
});
