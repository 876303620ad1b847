import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { startControlServer } from "../../packages/control/src/server/control-server.ts";
import { loadSettings } from "../../packages/control/src/settings.ts";
import { TEST_SNAPSHOT_CACHE } from "../../packages/control/src/testing/server.ts";
import { verifyPassword } from "../../packages/control/src/identity/passwords.ts";

async function adminHash(databaseUrl: string): Promise<string> {
  const db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  try {
    return (await db.query(`select password_hash from user_password where user_id = 'sandbar-admin'`)).rows[0].password_hash;
  } finally {
    await db.end();
  }
}

describe("the bootstrap admin's password", () => {
  it("is generated once, written 0600 (its path logged, not its value), kept across restarts, and replaced by SANDBAR_BOOTSTRAP_PASSWORD", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "sandbar-boot-pw-"));
    const lines: string[] = [];
    // No sandboxes here: the shared snapshot cache (no debootstrap build of its own racing the
    // stops) and no warm pool.
    const settings = { ...loadSettings({}), port: 0, host: "127.0.0.1", dataDir, snapshotCacheDir: TEST_SNAPSHOT_CACHE, warmPool: 0 };
    try {
      let server = await startControlServer(settings, (l) => lines.push(l));
      const file = join(dataDir, "admin-password");
      const password = (await readFile(file, "utf8")).trim();
      expect(password.length).toBeGreaterThanOrEqual(20);
      expect((await stat(file)).mode & 0o777).toBe(0o600);
      expect(lines.some((l) => l.includes(password))).toBe(false);
      expect(lines.some((l) => l.includes(file))).toBe(true);
      const hash = await adminHash(server.databaseUrl);
      expect(hash).not.toContain(password);
      expect(await verifyPassword(password, hash)).toBe(true);
      expect(await verifyPassword(password + "x", hash)).toBe(false);
      await server.stop();

      lines.length = 0;
      server = await startControlServer(settings, (l) => lines.push(l));
      expect(lines.some((l) => l.includes(password))).toBe(false);
      expect(await verifyPassword(password, await adminHash(server.databaseUrl))).toBe(true);
      await server.stop();

      lines.length = 0;
      server = await startControlServer({ ...settings, bootstrapPassword: "operator-chosen secret" }, (l) => lines.push(l));
      const replaced = await adminHash(server.databaseUrl);
      expect(await verifyPassword("operator-chosen secret", replaced)).toBe(true);
      expect(await verifyPassword(password, replaced)).toBe(false);
      expect(lines.join("\n")).not.toContain("operator-chosen secret");
      await server.stop();
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
