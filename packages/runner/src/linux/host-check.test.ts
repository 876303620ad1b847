import { execFileSync } from "node:child_process";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { checkHost, formatChecks } from "./host-check.ts";

// The host checks on this real host: tools the test suites themselves rely on must be reported
// present, and `sandbar doctor` says so with its exit code.

const asRoot = process.getuid?.() === 0;
const repo = path.resolve(import.meta.dirname, "../../../..");

describe("host checks", () => {
  it("report each check with what was found, and a fix for what is missing", async () => {
    const checks = await checkHost();
    const byName = new Map(checks.map((c) => [c.name, c]));
    for (const name of ["bubblewrap", "setpriv", "overlayfs", "cgroups", "git"]) expect(byName.get(name)?.ok, name).toBe(true);
    expect(byName.get("bubblewrap")?.detail).toMatch(/bubblewrap \d/);
    expect(byName.get("cgroups")?.detail).toMatch(/^v[12] .*memory/);
    for (const c of checks) if (!c.ok && c.required) expect(c.fix, c.name).toBeTruthy();
    expect(formatChecks(checks).every((l) => /^(ok     |MISSING|absent ) /.test(l))).toBe(true);
  });

  it.skipIf(!asRoot)("sandbar doctor exits 0 on a host that runs sandboxes", () => {
    const out = execFileSync(process.execPath, [path.join(repo, "packages/cli/src/main.ts"), "doctor"]).toString();
    expect(out).toContain("ok      bubblewrap");
    expect(out).not.toContain("MISSING");
  });
});
