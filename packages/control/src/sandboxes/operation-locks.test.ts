import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "./testing/fixtures.ts";
import pg from "pg";
import { Code, ConnectError } from "@sandbar/protocol";
import { ClusterLocks, lockKey } from "./cluster-locks.ts";
import { HeldElsewhere, OperationLocks } from "./operation-locks.ts";

// A create takes its sandbox's shared lock alongside its transaction (tryRunNew) instead of
// before it: these check that the lock is still held before the row commits, refused when
// another process holds it (nothing inserted then), and given back however the work ends.
// Real PostgreSQL (the test server's), two ClusterLocks as two control processes would hold. And
// a lost connection: replaced by the next operation, but not while the server stops.

let t: TestServer;
let mine: ClusterLocks;
let other: ClusterLocks;
let locks: OperationLocks;

beforeAll(async () => {
  t = await startTestServer();
  mine = new ClusterLocks(t.server.databaseUrl);
  other = new ClusterLocks(t.server.databaseUrl);
  locks = new OperationLocks(mine);
}, 120_000);

afterAll(async () => {
  await mine?.close();
  await other?.close();
  await t?.stop();
});

describe("tryRunNew", () => {
  it("holds the shared lock once `held` settles, and gives it back when the work is done", async () => {
    const id = randomUUID();
    const out = await locks.tryRunNew(id, async (held) => {
      await held;
      expect(locks.busy(id)).toBe(true);
      expect(await other.acquire(id)).toBe(false); // another process is refused meanwhile
      return "done";
    });
    expect(out).toBe("done");
    await locks.idle(5000);
    expect(locks.busy(id)).toBe(false);
    expect(await other.acquire(id)).toBe(true);
    await other.release(id);
  });

  it("refuses with HeldElsewhere when another process holds it, and the row is not inserted", async () => {
    const res = await api(t.url, t.adminKey, "POST", "/sandbox", {});
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const made = (await t.server.sandboxes.manager.store.byId(res.body.id))!;
    const { store } = t.server.sandboxes.manager;
    const row = { ...made, id: randomUUID(), name: `held-${randomUUID()}`, state: "unknown" as const };
    expect(await other.acquire(row.id)).toBe(true);
    try {
      const op = locks.tryRunNew(row.id, (held) => store.insert(row, undefined, held));
      await expect(op).rejects.toBeInstanceOf(HeldElsewhere);
      expect(await store.byId(row.id)).toBeNull();
      await locks.idle(5000);
      expect(locks.busy(row.id)).toBe(false);
    } finally {
      await other.release(row.id);
      await t.server.sandboxes.manager.delete(made.organizationId, made.id);
    }
  }, 60_000);

  it("gives the lock back when the work fails before it waited for it", async () => {
    const id = randomUUID();
    const op = locks.tryRunNew(id, async () => {
      throw new Error("refused before the lock mattered");
    });
    await expect(op).rejects.toThrow("refused before the lock mattered");
    expect(await other.acquire(id)).toBe(true);
    await other.release(id);
  });
});

describe("a lost connection", () => {
  /** Ends the backend of `application_name` sandbar-operation-locks that holds the lock of `id` (as a database going down does). */
  async function dropConnectionOf(id: string): Promise<void> {
    const key = BigInt(lockKey(id));
    const [classid, objid] = [Number((key >> 32n) & 0xffffffffn), Number(key & 0xffffffffn)];
    const admin = new pg.Client({ connectionString: t.server.databaseUrl });
    await admin.connect();
    try {
      const { rows } = await admin.query("select pg_terminate_backend(pid) as ok from pg_locks where locktype = 'advisory' and classid = $1 and objid = $2", [classid, objid]);
      expect(rows).toEqual([{ ok: true }]);
    } finally {
      await admin.end();
    }
  }

  it("is replaced (and said so) by the next operation, but not once shutdown began", async () => {
    const log: string[] = [];
    const locks = new ClusterLocks(t.server.databaseUrl, (l) => log.push(l));
    try {
      const first = randomUUID();
      expect(await locks.acquire(first)).toBe(true);
      await dropConnectionOf(first);
      // The next acquire finds the connection gone (or about to go: it is retried) and makes a new one.
      const second = randomUUID();
      await eventually("a new connection", async () => locks.acquire(second).catch(() => false));
      expect(log.filter((l) => l.includes("reconnecting"))).toHaveLength(1);
      expect(log[0]).toMatch(/^operation locks: connection lost \(.+\); reconnecting$/);

      await dropConnectionOf(second);
      locks.stopping();
      const third = randomUUID();
      const refused = (e: unknown) => e instanceof ConnectError && e.code === Code.Unavailable && e.rawMessage === "The server is shutting down";
      await eventually("the loss to be seen", async () => locks.acquire(third).then(() => false, refused));
      expect(log.filter((l) => l.includes("reconnecting"))).toHaveLength(1);
    } finally {
      await locks.close();
    }
  });
});
