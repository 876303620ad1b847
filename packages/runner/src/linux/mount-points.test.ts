import { lstat, mkdir, mkdtemp, rm, symlink } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ensureMountPoint } from "../host/rootprep.ts";

// The provider makes a start's mount points at once; siblings then race to make shared parents.
// Each must still end as the right kind, owned as asked, and a planted symlink still refused.

describe("mount points made at once", () => {
  let root: string;
  const owner = { uid: 4242, gid: 4343 };
  beforeEach(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), "sandbar-points-"));
  });
  afterEach(() => rm(root, { recursive: true, force: true }));

  it("siblings under new shared parents, files and directories, some twice", async () => {
    const targets = Array.from({ length: 16 }, (_, i) => ({ target: `/opt/sandbar/cgroup/${i % 12}`, dir: false }));
    targets.push(...Array.from({ length: 8 }, (_, i) => ({ target: `/home/dev/work/p${i % 6}/x`, dir: true })));
    await Promise.all(targets.map((t) => ensureMountPoint(root, t.target, t.dir, { ownedBelow: "/home/dev", owner })));
    for (const t of targets) {
      const st = await lstat(path.join(root, t.target));
      expect(t.dir ? st.isDirectory() : st.isFile()).toBe(true);
    }
    for (const d of ["/home/dev", "/home/dev/work", "/home/dev/work/p3", "/home/dev/work/p3/x"]) {
      expect(await lstat(path.join(root, d))).toMatchObject({ uid: owner.uid, gid: owner.gid });
    }
    for (const d of ["/opt", "/opt/sandbar/cgroup", "/home"]) expect((await lstat(path.join(root, d))).uid).toBe(0);
  });

  it("still refuses a symlinked component, whichever call meets it", async () => {
    await mkdir(path.join(root, "opt"));
    await symlink("/etc", path.join(root, "opt/sandbar"));
    const results = await Promise.allSettled(Array.from({ length: 6 }, (_, i) => ensureMountPoint(root, `/opt/sandbar/cgroup/${i}`, false)));
    expect(results.every((r) => r.status === "rejected" && /symbolic link/.test(String(r.reason)))).toBe(true);
  });

  it("refuses a directory where a file bind's mount point goes, and a file where a directory's", async () => {
    await mkdir(path.join(root, "srv/f"), { recursive: true });
    await expect(ensureMountPoint(root, "/srv/f", false)).rejects.toThrow(/not a regular file/);
    await ensureMountPoint(root, "/srv/g", false);
    await expect(ensureMountPoint(root, "/srv/g/h", true)).rejects.toThrow(/not a directory/);
  });
});
