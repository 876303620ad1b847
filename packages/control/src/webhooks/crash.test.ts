import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { Webhook } from "standardwebhooks";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startEmbeddedPostgres, type RunningPostgres } from "../db/embedded-postgres.ts";
import { freePort } from "@sandbar/runner/free-port";
import { api, TEST_SNAPSHOT_CACHE } from "../testing/server.ts";
import { Receiver } from "./testing/receiver.ts";

// kill -9 of a real server process (`sandbar serve`) while events it recorded are queued or in
// flight to a receiver that does not answer; a new server on the same database must deliver
// exactly the events the outbox holds, each accepted once (by webhook-id), and none other.
// PostgreSQL runs outside the server (DATABASE_URL) so the test reads the outbox throughout.

const CLI = fileURLToPath(new URL("../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
const TIMEOUT_MS = 2000; // an attempt's bound; a claim's lease is this + 10 s

let dataDir: string;
let postgres: RunningPostgres;
let db: pg.Client;
let env: NodeJS.ProcessEnv;
let url: string;
const key = "sbr_" + randomBytes(32).toString("hex");
const servers: ChildProcess[] = [];
const receiver = new Receiver();

async function serve(): Promise<ChildProcess> {
  const child = spawn(process.execPath, [CLI, "serve"], { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
  servers.push(child);
  let out = "";
  child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
  child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
  const exited = new Promise<never>((_, reject) => child.once("exit", () => reject(new Error(`the server exited:\n${out}`))));
  const ready = (async () => {
    for (let i = 0; i < 600; i++) {
      if (await fetch(`${url}/api/config`).then((r) => r.ok, () => false)) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`the server did not answer:\n${out}`);
  })();
  await Promise.race([ready, exited]);
  exited.catch(() => undefined);
  return child;
}

const call = (method: string, p: string, body?: unknown) => api(url, key, method, p, body);

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-webhook-crash-"));
  await chmod(dataDir, 0o711); // PostgreSQL runs as its own user under root and must traverse it
  postgres = await startEmbeddedPostgres(path.join(dataDir, "db"), () => {});
  // With DATABASE_URL the server does not make its data dir itself (it writes its admin password there).
  await mkdir(path.join(dataDir, "server"), { mode: 0o700 });
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  await receiver.start();
  env = {
    ...process.env,
    DATABASE_URL: postgres.url,
    SANDBAR_DATA_DIR: path.join(dataDir, "server"),
    SANDBAR_PORT: String(port),
    SANDBAR_HOST: "127.0.0.1",
    SANDBAR_BOOTSTRAP_API_KEY: key,
    SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
    SANDBAR_WARM_POOL: "0",
    SANDBAR_WEBHOOK_ALLOW_PRIVATE: "true",
    SANDBAR_WEBHOOK_TIMEOUT_MS: String(TIMEOUT_MS),
    SANDBAR_WEBHOOK_RETRY_SCHEDULE: "100ms,200ms,400ms,800ms,1s,1s,1s,1s",
    // Two attempts in flight at most: the rest of the events wait in the queue when the server dies.
    SANDBAR_WEBHOOK_CONCURRENCY: "2",
  };
});

afterAll(async () => {
  for (const s of servers) if (s.exitCode === null && s.signalCode === null) s.kill("SIGKILL");
  await receiver.close();
  await db?.end().catch(() => undefined);
  await postgres?.stop().catch(() => undefined);
  await rm(dataDir, { recursive: true, force: true });
});

it("after kill -9 between the changes and their delivery, a restarted server delivers exactly the recorded events, once each", async () => {
  receiver.answer = () => "hang";
  const first = await serve();
  db = new pg.Client({ connectionString: postgres.url });
  await db.connect();
  const org = ((await call("GET", "/organizations")).body as Array<{ id: string }>)[0]!.id;
  const made = await call("POST", `/webhooks/organizations/${org}/endpoints`, { url: receiver.url });
  expect(made.status, JSON.stringify(made.body)).toBe(201);
  const secret = made.body.secret as string;

  const create = async (name: string) => {
    const res = await call("POST", "/sandbox", { name });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body.id as string;
  };
  const a = await create("hook-a");
  expect((await call("POST", `/sandbox/${a}/stop`)).body.state).toBe("stopped");
  const b = await create("hook-b");
  expect((await call("POST", `/webhooks/organizations/${org}/endpoints/${made.body.endpoint.id}/test`)).status).toBe(202);
  // Deliveries are in flight (hanging) and queued behind them.
  await receiver.until("deliveries in flight", () => receiver.got.length >= 2);
  // A change the API confirmed, then the process dies at once; a create in flight beside it.
  expect((await call("POST", `/sandbox/${b}/stop`)).body.state).toBe("stopped");
  void call("POST", "/sandbox", { name: "hook-in-flight" }).catch(() => undefined);
  await new Promise((r) => setTimeout(r, 100));
  first.kill("SIGKILL");
  await new Promise((r) => first.once("exit", r));

  const outbox = async () => (await db.query<{ id: string; body: string }>(`select id, body from webhook_message order by created_at`)).rows;
  const recorded = await outbox();
  expect(recorded.length).toBeGreaterThanOrEqual(9); // a: 4, b: 4, the test event
  expect(receiver.accepted()).toEqual([]);
  const inFlightBefore = new Set(receiver.got.map((g) => g.id));

  receiver.answer = () => 200;
  const second = await serve();
  try {
    // Claims of the dead process are due again when their lease ends; everything else at once.
    const settled = async () => {
      const rows = (await outbox()).map((m) => m.id);
      const pending = (await db.query(`select 1 from webhook_delivery where status <> 'succeeded'`)).rowCount;
      return pending === 0 && new Set(receiver.accepted().map((g) => g.id)).size === rows.length;
    };
    const end = Date.now() + 60_000;
    while (!(await settled())) {
      if (Date.now() > end) throw new Error(`not settled: ${JSON.stringify(await db.query(`select status, attempts, next_attempt_at from webhook_delivery`).then((r) => r.rows))}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    await new Promise((r) => setTimeout(r, 1000)); // room for a duplicate to show, were there one

    const final = await outbox();
    const byId = new Map(final.map((m) => [m.id, m.body]));
    // Nothing recorded before the crash was lost, nor changed.
    for (const m of recorded) expect(byId.get(m.id)).toBe(m.body);
    // Exactly the recorded events were accepted, once each, byte for byte and signed; nothing else was ever sent.
    const accepted = receiver.accepted();
    expect(accepted.map((g) => g.id).sort()).toEqual([...byId.keys()].sort());
    for (const g of accepted) {
      expect(g.body).toBe(byId.get(g.id));
      new Webhook(secret).verify(g.body, g.headers as Record<string, string>);
    }
    for (const g of receiver.got) expect(byId.has(g.id), g.id).toBe(true);
    // The hung attempts were retried under the same webhook-id.
    for (const id of inFlightBefore) expect(accepted.some((g) => g.id === id)).toBe(true);

    // Per sandbox, the events form one unbroken chain from its creation to the state it is in now:
    // none lost, none invented.
    const events = final.map((m) => JSON.parse(m.body) as Record<string, string>).filter((e) => e.event.startsWith("sandbox."));
    const ids = new Set(events.map((e) => e.id));
    expect(ids.has(a) && ids.has(b)).toBe(true);
    for (const id of ids) {
      const mine = events.filter((e) => e.id === id);
      const created = mine.filter((e) => e.event === "sandbox.created");
      expect(created, id).toHaveLength(1);
      let state = created[0]!.state;
      const updates = mine.filter((e) => e.event === "sandbox.state.updated").sort((x, y) => x.timestamp!.localeCompare(y.timestamp!));
      for (const u of updates) {
        expect(u.oldState, `${id}: ${JSON.stringify(updates)}`).toBe(state);
        state = u.newState!;
      }
      const now = await call("GET", `/sandbox/${id}`);
      expect(now.body.state, id).toBe(state);
    }
    expect(events.filter((e) => e.id === a).map((e) => e.newState ?? e.state)).toEqual(["creating", "started", "stopping", "stopped"]);
    expect(events.filter((e) => e.id === b).map((e) => e.newState ?? e.state)).toEqual(["creating", "started", "stopping", "stopped"]);

    for (const id of ids) await call("DELETE", `/sandbox/${id}`);
    await receiver.until("the deletes' events", () => receiver.accepted().length >= final.length + 2 * ids.size);

    // A graceful stop with an attempt in flight hands its claim back at once (no lease to wait out).
    receiver.answer = () => "hang";
    const hung = (await call("POST", `/webhooks/organizations/${org}/endpoints/${made.body.endpoint.id}/test`)).body.messageId as string;
    await receiver.until("the attempt in flight", () => receiver.got.some((g) => g.id === hung));
    second.kill("SIGTERM");
    await new Promise((r) => second.once("exit", r));
    const [row] = (await db.query(`select status, attempts, next_attempt_at <= now() as due from webhook_delivery where message_id = $1`, [hung])).rows;
    expect(row).toEqual({ status: "pending", attempts: 0, due: true });
  } finally {
    if (second.exitCode === null && second.signalCode === null) {
      second.kill("SIGTERM");
      await new Promise((r) => second.once("exit", r));
    }
  }
});
