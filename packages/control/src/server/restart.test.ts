import { readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, startTestServer, TEST_SNAPSHOT_CACHE } from "../testing/server.ts";

describe("persistence", () => {
  it("keeps keys across a restart on the same data dir, with the embedded PostgreSQL back", async () => {
    const first = await startTestServer();
    const created = await api(first.url, first.adminKey, "POST", "/api-keys", { name: "survivor", permissions: ["write:sandboxes"] });
    expect(created.status).toBe(201);
    await first.stop({ keepData: true });
    expect((await fetch(`${first.url}/api/config`).catch(() => null))?.ok ?? false).toBe(false);

    const second = await startTestServer({ dataDir: first.dataDir, adminKey: first.adminKey });
    try {
      const current = await api(second.url, created.body.value, "GET", "/api-keys/current");
      expect(current.status).toBe(200);
      expect(current.body.permissions).toEqual(["write:sandboxes"]);
      expect((await api(second.url, second.adminKey, "GET", "/api-keys/survivor")).status).toBe(200);
    } finally {
      await second.stop({ keepData: true });
    }
  });

  it("generates the admin key at first start, writes it 0600 (logging where, not what), and keeps it", async () => {
    const { startControlServer } = await import("./control-server.ts");
    const { loadSettings } = await import("../settings.ts");
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const dataDir = await mkdtemp(join(tmpdir(), "sandbar-boot-"));
    const lines: string[] = [];
    // No sandboxes here: the shared snapshot cache (no debootstrap build of its own racing the
    // stop) and no warm pool (whose sandboxes would hold mounts in the data dir).
    const settings = { ...loadSettings({}), port: 0, host: "127.0.0.1", dataDir, snapshotCacheDir: TEST_SNAPSHOT_CACHE, warmPool: 0 };
    let server = await startControlServer(settings, (l) => lines.push(l));
    const key = (await readFile(join(dataDir, "admin-api-key"), "utf8")).trim();
    expect(key).toMatch(/^sbr_[0-9a-f]{64}$/);
    expect((await stat(join(dataDir, "admin-api-key"))).mode & 0o777).toBe(0o600);
    expect(lines.some((l) => l.includes(key))).toBe(false); // the file's path is logged, not the key
    expect(lines.some((l) => l.includes(join(dataDir, "admin-api-key")))).toBe(true);
    expect((await api(server.url, key, "GET", "/api-keys/current")).status).toBe(200);
    await server.stop();

    lines.length = 0;
    server = await startControlServer(settings, (l) => lines.push(l));
    expect(lines.some((l) => l.includes(key))).toBe(false);
    expect((await api(server.url, key, "GET", "/api-keys/current")).status).toBe(200);
    await server.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  it("starts on an external database with a data dir that does not exist yet (made 0700 for the admin's files)", async () => {
    const db = await startTestServer();
    const dataDir = join(db.dataDir, "not", "yet");
    const other = await startTestServer({ databaseUrl: db.server.databaseUrl, dataDir, adminKey: db.adminKey });
    try {
      expect((await stat(dataDir)).mode & 0o777).toBe(0o700);
      expect((await api(other.url, db.adminKey, "GET", "/api-keys/current")).status).toBe(200);
    } finally {
      await other.stop();
      await db.stop();
    }
  });

  it("revokes a deleted key at once in every control process sharing the database", async () => {
    const a = await startTestServer();
    const b = await startTestServer({ databaseUrl: a.server.databaseUrl, adminKey: a.adminKey });
    try {
      const created = await api(a.url, a.adminKey, "POST", "/api-keys", { name: "shared", permissions: [] });
      // Warm b's credential cache, then delete through a and use it at b straight away.
      expect((await api(b.url, created.body.value, "GET", "/api-keys/current")).status).toBe(200);
      expect((await api(a.url, a.adminKey, "DELETE", "/api-keys/shared")).status).toBe(204);
      expect((await api(b.url, created.body.value, "GET", "/api-keys/current")).status).toBe(401);
    } finally {
      await b.stop();
      await a.stop();
    }
  });
});
