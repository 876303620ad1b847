import { execFile } from "node:child_process";
import { cp, mkdir, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { ensureDefaultSnapshot } from "@sandbar/runner/linux";
import { TEST_SNAPSHOT_CACHE } from "../../packages/control/src/testing/server.ts";

// The install step of `npm start` and CI (scripts/host-packages.sh) on a clean Debian root: a
// copy-on-write overlay of the default snapshot (a bookworm minbase, as a new machine's base
// system), entered with chroot, with Debian's real archive. Proves that the package list installs
// and that a fresh machine ends up with what sandboxes need.

const run = promisify(execFile);
const asRoot = process.getuid?.() === 0;
const repo = path.resolve(import.meta.dirname, "../..");
let scratch: string | undefined;
let root: string | undefined;

afterAll(async () => {
  if (root) {
    for (const m of ["proc", ""]) await run("umount", ["-l", path.join(root, m)]).catch(() => undefined);
  }
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe.skipIf(!asRoot)("a fresh Debian machine", () => {
  it("gets every host package sandboxes need from ensure_host_packages", { timeout: 600_000 }, async () => {
    const snapshot = await ensureDefaultSnapshot({ dataDir: TEST_SNAPSHOT_CACHE });
    if (snapshot.kind !== "debootstrap") return expect.unreachable("the debootstrap snapshot is needed as a clean Debian root");
    scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-fresh-"));
    const upper = path.join(scratch, "upper");
    const work = path.join(scratch, "work");
    root = path.join(scratch, "root");
    for (const d of [upper, work, root]) await mkdir(d);
    await run("mount", ["-t", "overlay", "overlay", "-o", `lowerdir=${snapshot.rootfs},upperdir=${upper},workdir=${work}`, root]);
    await run("mount", ["-t", "proc", "proc", path.join(root, "proc")]);
    await cp("/etc/resolv.conf", path.join(root, "etc/resolv.conf"), { dereference: true });
    await cp(path.join(repo, "scripts/host-packages.sh"), path.join(root, "host-packages.sh"));

    const script = "source /host-packages.sh && ensure_host_packages $SANDBOX_PACKAGES && for p in $SANDBOX_PACKAGES; do dpkg -s $p >/dev/null || echo MISSING $p; done; command -v bwrap setpriv mkfs.ext4 debootstrap git pylsp";
    const out = await run("chroot", [root, "/bin/bash", "-c", script], { env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" }, maxBuffer: 64 << 20 });
    expect(out.stderr).toMatch(/installing host packages: .*bubblewrap/);
    expect(out.stdout).not.toContain("MISSING");
    expect(out.stdout.trim().split("\n")).toHaveLength(6);
    // Run again: nothing left to install, so nothing is fetched.
    const again = await run("chroot", [root, "/bin/bash", "-c", "source /host-packages.sh && ensure_host_packages $SANDBOX_PACKAGES"], { env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" } });
    expect(again.stderr).not.toContain("installing");
  });
});
