import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { sandboxUser } from "../host/rootprep.ts";

// Who a sandbox's user is inside, from a root's /etc/passwd (an image's USER keeps its uid).

describe("sandboxUser", () => {
  let root: string;
  beforeEach(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), "sandbar-user-"));
    await mkdir(path.join(root, "etc"));
  });
  afterEach(() => rm(root, { recursive: true, force: true }));

  it("keeps a passwd entry's uid, gid and /home home; 1000 for a user the root lacks; 0 for root", async () => {
    await writeFile(path.join(root, "etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\nsvc:x:998:998::/var/lib/svc:/bin/false\nbad:x:abc:1::/home/bad:/bin/sh\n");
    expect(await sandboxUser(root, "app")).toEqual({ name: "app", uid: 1001, gid: 1002, home: "/home/app" });
    // A home outside /home is not handed over to the sandbox user: it gets /home/<name>.
    expect(await sandboxUser(root, "svc")).toEqual({ name: "svc", uid: 998, gid: 998, home: "/home/svc" });
    expect(await sandboxUser(root, "bad")).toEqual({ name: "bad", uid: 1000, gid: 1000, home: "/home/bad" });
    expect(await sandboxUser(root, "sandbar")).toEqual({ name: "sandbar", uid: 1000, gid: 1000, home: "/home/sandbar" });
    expect(await sandboxUser(root, "root")).toEqual({ name: "root", uid: 0, gid: 0, home: "/root" });
  });

  it("does not follow a symlinked /etc/passwd or /etc out of the root", async () => {
    const outside = await mkdtemp(path.join(os.tmpdir(), "sandbar-user-out-"));
    try {
      await writeFile(path.join(outside, "passwd"), "app:x:4242:4242::/home/app:/bin/sh\n");
      await symlink(path.join(outside, "passwd"), path.join(root, "etc/passwd"));
      expect((await sandboxUser(root, "app")).uid).toBe(1000);
      await rm(path.join(root, "etc"), { recursive: true });
      await symlink(outside, path.join(root, "etc"));
      expect((await sandboxUser(root, "app")).uid).toBe(1000);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });
});
