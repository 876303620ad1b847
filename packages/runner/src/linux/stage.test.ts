import { execFileSync } from "node:child_process";
import { chmod, cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { reachableByOthers, reachablePath } from "./stage.ts";

// Files in a private directory (a checkout under /root) are copied where an unprivileged user
// can read and run them. Checked as a real unprivileged uid (nobody).

const asRoot = process.getuid?.() === 0;
const scratch: string[] = [];
afterAll(async () => {
  for (const d of scratch) await rm(d, { recursive: true, force: true });
});

function nobodyCan(test: "-r" | "-x", p: string): boolean {
  try {
    execFileSync("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "test", test, p]);
    return true;
  } catch {
    return false;
  }
}

describe.skipIf(!asRoot)("staging runtime files for sandbox users", () => {
  it("copies a private file and directory once, readable and runnable by others", async () => {
    const home = await mkdtemp(path.join(os.tmpdir(), "sandbar-private-"));
    const staging = await mkdtemp(path.join(os.tmpdir(), "sandbar-stage-"));
    scratch.push(home, staging);
    await chmod(home, 0o700);
    const node = path.join(home, "node");
    await cp(process.execPath, node);
    const bundle = path.join(home, "dist");
    await cp(path.join(import.meta.dirname, "testing"), bundle, { recursive: true });
    await writeFile(path.join(bundle, "secretish"), "x", { mode: 0o600 });
    await chmod(staging, 0o700); // the staging dir's parents are opened up as needed

    expect(await reachableByOthers(node)).toBe(false);
    expect(nobodyCan("-x", node)).toBe(false);
    const stagedNode = await reachablePath(node, path.join(staging, "a"));
    const stagedBundle = await reachablePath(bundle, path.join(staging, "a"));
    expect(stagedNode).not.toBe(node);
    expect(nobodyCan("-x", stagedNode)).toBe(true);
    expect(nobodyCan("-r", path.join(stagedBundle, "secretish"))).toBe(true);
    expect(execFileSync("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", stagedNode, "-p", "1+1"]).toString().trim()).toBe("2");

    // Same contents: the same copy. Changed contents: a new one.
    expect(await reachablePath(node, path.join(staging, "a"))).toBe(stagedNode);
    await writeFile(path.join(bundle, "secretish"), "changed");
    expect(await reachablePath(bundle, path.join(staging, "a"))).not.toBe(stagedBundle);
  });

  it("leaves reachable paths where they are", async () => {
    const open = await mkdtemp(path.join(os.tmpdir(), "sandbar-open-"));
    scratch.push(open);
    await chmod(open, 0o755);
    const file = path.join(open, "f");
    await writeFile(file, "x", { mode: 0o644 });
    expect(await reachablePath(file, "/nonexistent/never-used")).toBe(file);
  });
});
