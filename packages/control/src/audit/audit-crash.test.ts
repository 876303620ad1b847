import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { freePort } from "@sandbar/runner/free-port";
import { api, startTestServer, TEST_SNAPSHOT_CACHE, type TestServer } from "../testing/server.ts";

// kill -9 of a real control process (`sandbar serve`) while a recorded call runs: its entry was
// written before the handler started, so it survives the crash as pending, and a control process
// sharing the database closes it with status 0 once it is 30 timer minutes old. The slow call is
// an operator's user creation (it generates an RSA-4096 key pair).

const CLI = fileURLToPath(new URL("../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

let t: TestServer;
let db: pg.Client;
let dataDir: string;
let child: ChildProcess | undefined;

beforeAll(async () => {
  // The survivor: a "minute" of 200 ms makes the 30-minute timeout 6 s (longer than a key pair takes).
  t = await startTestServer({ settings: { timerMinuteMs: 200, timerTickMs: 100 } });
  db = new pg.Client({ connectionString: t.server.databaseUrl });
  await db.connect();
  dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-audit-crash-"));
});

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  await db?.end();
  await t?.stop();
  await rm(dataDir, { recursive: true, force: true });
});

async function serve(port: number): Promise<ChildProcess> {
  const env = {
    ...process.env,
    SANDBAR_DATA_DIR: dataDir,
    DATABASE_URL: t.server.databaseUrl,
    SANDBAR_PORT: String(port),
    SANDBAR_HOST: "127.0.0.1",
    SANDBAR_BOOTSTRAP_API_KEY: t.adminKey,
    SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
    SANDBAR_WARM_POOL: "0",
  };
  const proc = spawn(process.execPath, [CLI, "serve"], { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout!.on("data", (c: Buffer) => (out += c.toString()));
  proc.stderr!.on("data", (c: Buffer) => (out += c.toString()));
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`the server exited:\n${out}`);
    if (await fetch(`http://127.0.0.1:${port}/api/config`).then((r) => r.ok, () => false)) return proc;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the server did not answer:\n${out}`);
}

const pendingUserCreate = async (name: string) =>
  (await db.query(`select id, status_code from audit_log where action = 'create' and target_type = 'user' and metadata->'body'->>'name' = $1`, [name])).rows as Array<{
    id: string;
    status_code: number | null;
  }>;

it("keeps the entry of a call in flight through kill -9, and closes it with status 0 later", { timeout: 120_000 }, async () => {
  const port = await freePort();
  child = await serve(port);
  let caught: string | undefined;
  // The race (the key pair may be ready before the kill) is retried with a new call.
  for (let attempt = 0; attempt < 5 && !caught; attempt++) {
    const name = `crash-${attempt}`;
    void api(`http://127.0.0.1:${port}`, t.adminKey, "POST", "/users", { id: name, name, email: `${name}@example.test` }).catch(() => undefined);
    let rows: Awaited<ReturnType<typeof pendingUserCreate>> = [];
    for (let i = 0; i < 500 && rows.length === 0; i++) {
      rows = await pendingUserCreate(name);
      if (!rows.length) await new Promise((r) => setTimeout(r, 2));
    }
    expect(rows, "the entry is written before the handler runs").toHaveLength(1);
    if (rows[0]!.status_code !== null) continue;
    child.kill("SIGKILL");
    await new Promise((r) => child!.once("exit", r));
    const after = await pendingUserCreate(name);
    if (after[0]?.status_code === null) caught = after[0].id;
    else child = await serve(port);
  }
  expect(caught, "a call caught in flight").toBeDefined();
  // The survivor's retention pass closes it once it is 30 (shortened) minutes old.
  const deadline = Date.now() + 20_000;
  let status: number | null = null;
  while (Date.now() < deadline && status === null) {
    status = (await db.query(`select status_code from audit_log where id = $1`, [caught])).rows[0].status_code;
    if (status === null) await new Promise((r) => setTimeout(r, 100));
  }
  expect(status).toBe(0);
});
