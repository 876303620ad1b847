import { mkdir, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { Code, ConnectError } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { unmount } from "../host/mounts.ts";
import { mountDiskImage } from "./mounts.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, leftovers, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// A start prepares several things at once (the cgroup and the disk mount alongside the runtime
// dirs): one that fails midway must still leave nothing mounted and no cgroup, whichever branch
// was still running, and the sandbox starts once the cause is gone.

let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  f = await fixture();
});

afterAll(() => disposeFixture(f, created));

/** What a failed start must not leave (the sandbox's own dir and files stay: it still exists). */
async function startLeftovers(id: string, hostUid: number): Promise<string[]> {
  const dir = f.provider.layout.sandboxDir(id);
  return (await leftovers(f.provider, id, hostUid)).filter((l) => l !== `directory ${dir}`);
}

describe("a start that fails while preparing the root", () => {
  for (const disk of [false, true]) {
    it(`leaves no mount, cgroup, loop device or runtime dir, and starts once fixed${disk ? " (disk-capped)" : ""}`, async () => {
      const id = uniqueId(disk ? "failcap" : "fail");
      created.add(id);
      const { hostUid } = await f.provider.create(f.spec(id, { user: "root", ...(disk ? { diskGiB: 1 } : {}) }));
      const L = f.provider.layout;
      // A planted /etc/passwd symlink in the writable layer: root-prep refuses to follow it.
      const plant = async (upper: string, fix: boolean) => {
        await mkdir(path.join(upper, "etc"), { recursive: true });
        if (fix) await rm(path.join(upper, "etc/passwd"));
        else await symlink("/etc/shadow", path.join(upper, "etc/passwd"));
      };
      const edit = async (fix: boolean) => {
        if (!disk) return plant(L.upper(id, false), fix);
        await mkdir(L.diskMount(id), { recursive: true });
        await mountDiskImage(L.diskImage(id), L.diskMount(id));
        try {
          await plant(L.upper(id, true), fix);
        } finally {
          await unmount(L.diskMount(id));
        }
      };
      await edit(false);
      const err = await f.provider.start(id).then(() => undefined, (e: unknown) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.FailedPrecondition);
      expect((err as ConnectError).message).toContain("/etc/passwd");
      expect(await startLeftovers(id, hostUid)).toEqual([]);
      expect((await f.provider.inspect(id)).state).toBe("created");

      await edit(true);
      await f.provider.start(id);
      expect((await sh(f.provider, id, "id -u")).stdout.trim()).toBe("0");
      await f.provider.stop(id, { force: true });
      expect(await startLeftovers(id, hostUid)).toEqual([]);
    });
  }
});

describe("a start that fails between the disk's mount and the overlay's (one shell does both)", () => {
  it("leaves the disk unmounted and its loop device gone, and starts once fixed", async () => {
    const id = uniqueId("failroot");
    created.add(id);
    const { hostUid } = await f.provider.create(f.spec(id, { diskGiB: 1 }));
    const L = f.provider.layout;
    // A file where the overlay's upper directory goes: its mkdir fails with the disk mounted.
    const onDisk = async (fn: () => Promise<void>) => {
      await mkdir(L.diskMount(id), { recursive: true });
      await mountDiskImage(L.diskImage(id), L.diskMount(id));
      try {
        await fn();
      } finally {
        await unmount(L.diskMount(id));
      }
    };
    await onDisk(async () => {
      await rm(L.upper(id, true), { recursive: true }); // made by mkfs
      await writeFile(L.upper(id, true), "not a directory");
    });
    const err = await f.provider.start(id).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.FailedPrecondition);
    expect((err as ConnectError).message).toContain("upper");
    expect(await startLeftovers(id, hostUid)).toEqual([]);

    await onDisk(() => rm(L.upper(id, true)));
    await f.provider.start(id);
    expect((await sh(f.provider, id, "echo ok")).stdout).toBe("ok\n");
    await f.provider.stop(id, { force: true });
    expect(await startLeftovers(id, hostUid)).toEqual([]);
  });
});
