import { createHash } from "node:crypto";
import pg from "pg";
import { errors } from "@sandbar/protocol";

// Which control process is working on a sandbox, across every process of one database: a
// session-level PostgreSQL advisory lock per sandbox, held on one connection of this process for
// as long as an operation runs. A process that dies (kill -9, a lost host) loses its connection
// and PostgreSQL releases its locks at once: a sandbox whose operation was cut short is then free
// for any other process to finish (recovery.ts), while one still being worked on is never taken.
// No lease to renew and no column to clean up.

/** Shared locks as OperationLocks uses them. */
export interface SharedLocks {
  /** Takes the sandbox's lock for this process; false when another process holds it. */
  acquire(id: string): Promise<boolean>;
  release(id: string): Promise<void>;
}

/** The advisory lock key of a sandbox: 64 bits of a hash of its id (its own key space by the prefix). */
export function lockKey(id: string): string {
  const hex = createHash("sha256").update(`sandbox:${id}`).digest("hex").slice(0, 16);
  return BigInt.asIntN(64, BigInt(`0x${hex}`)).toString();
}

export class ClusterLocks implements SharedLocks {
  readonly #databaseUrl: string;
  readonly #log: (line: string) => void;
  #client: Promise<pg.Client> | undefined;
  /** Locks this process holds, for the connection they were taken on (a new connection holds none). */
  readonly #held = new Map<string, pg.Client>();
  /** The connection's queries, one at a time (node-postgres deprecates queueing them itself). */
  #queue: Promise<unknown> = Promise.resolve();
  #closed = false;
  /** Set when shutdown begins: no new connection is made (the database may be going down with us). */
  #stopping = false;
  /** Why the last connection dropped; said when a new one replaces it. */
  #lost: string | undefined;

  constructor(databaseUrl: string, log: (line: string) => void = () => undefined) {
    this.#databaseUrl = databaseUrl;
    this.#log = log;
  }

  async acquire(id: string): Promise<boolean> {
    if (this.#closed) return false;
    if (this.#stopping && !this.#client) throw errors.unavailable("The server is shutting down");
    const client = await this.#connection();
    const { rows } = await this.#query<{ ok: boolean }>(client, "select pg_try_advisory_lock($1::bigint) as ok", [lockKey(id)]);
    if (rows[0]?.ok) this.#held.set(id, client);
    return rows[0]?.ok === true;
  }

  async release(id: string): Promise<void> {
    const client = this.#held.get(id);
    this.#held.delete(id);
    // Taken on a connection that has since dropped: PostgreSQL released it then.
    if (!client || client !== (await this.#client?.catch(() => undefined))) return;
    await this.#query(client, "select pg_advisory_unlock($1::bigint)", [lockKey(id)]);
  }

  #query<R extends pg.QueryResultRow>(client: pg.Client, sql: string, args: unknown[]): Promise<pg.QueryResult<R>> {
    const run = this.#queue.then(() => client.query<R>(sql, args));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  /** Shutdown began: a connection that drops from now on is not replaced (nor its loss logged). */
  stopping(): void {
    this.#stopping = true;
  }

  /** Ends the connection: every lock still held is released with it. */
  async close(): Promise<void> {
    this.#closed = true;
    const client = await this.#client?.catch(() => undefined);
    this.#client = undefined;
    this.#held.clear();
    await client?.end().catch(() => undefined);
  }

  #connection(): Promise<pg.Client> {
    if (this.#client) return this.#client;
    // Said here rather than when it drops: a drop while the server stops (its database going
    // down with the same Ctrl-C) is expected, and nothing reconnects then.
    if (this.#lost !== undefined) this.#log(`operation locks: connection lost (${this.#lost}); reconnecting`);
    this.#lost = undefined;
    const client = new pg.Client({ connectionString: this.#databaseUrl, application_name: "sandbar-operation-locks" });
    let connecting!: Promise<pg.Client>;
    connecting = (async () => {
      try {
        await client.connect();
      } catch (err) {
        if (this.#client === connecting) this.#client = undefined;
        throw err;
      }
      return client;
    })();
    const drop = (reason: string) => {
      // Its locks went with it: operations running now carry on; new ones take a new connection.
      if (this.#client !== connecting) return;
      this.#client = undefined;
      if (!this.#closed) this.#lost = reason;
    };
    client.on("error", (err) => drop(err.message));
    client.on("end", () => drop("the server ended it"));
    this.#client = connecting;
    return connecting;
  }
}
