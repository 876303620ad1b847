import { randomUUID } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";
import pg from "pg";
import { Webhook } from "standardwebhooks";
import type { SecretBox } from "../auth/secret-box.ts";
import { dateOf, type Exec, execIn, pgArray } from "../db/exec.ts";
import { WEBHOOK_CHANNEL } from "./events.ts";
import { send, type SendResult } from "./send.ts";
import type { WebhookSettings } from "./settings.ts";

// Delivery from the outbox. Every control process runs one worker; they share the queue through
// PostgreSQL: due deliveries are claimed with FOR UPDATE SKIP LOCKED (no two processes take the
// same row), and a claim pushes the row's due time out by a lease longer than an attempt can
// last, so a row whose process died mid-attempt becomes due again by itself. Workers wake on the
// NOTIFY each recorded event sends, and poll as a fallback (a notification missed while the
// listening connection was down). Delivery is at least once: every attempt of an event carries
// the same webhook-id, so receivers de-duplicate.

/** How long delivered (or abandoned) events and their attempts are kept. */
const RETENTION_DAYS = 30;

/** A claimed delivery, with what sending it needs. */
interface Claimed {
  id: string;
  message_id: string;
  endpoint_id: string;
  attempts: number;
  event_type: string;
  body: string;
  url: string;
  secret: string;
  previous_secret: string | null;
  previous_secret_until: Date | string | null;
}

export class WebhookWorker {
  readonly #orm: MikroORM;
  readonly #box: SecretBox;
  readonly #s: WebhookSettings;
  readonly #log: (line: string) => void;
  #listener?: pg.Client;
  #timer?: NodeJS.Timeout;
  /** Wakes the worker when the earliest queued delivery falls due (a retry, an expired lease). */
  #wake?: NodeJS.Timeout;
  #draining = false;
  #again = false;
  #stopped = false;
  readonly #inFlight = new Set<Promise<void>>();
  /** Claimed deliveries whose attempt is not recorded yet: released on stop rather than left to their lease. */
  readonly #unrecorded = new Set<string>();
  #purgedAt = 0;
  /** Aborts attempts in flight on stop: left unrecorded, they are due again once their lease ends. */
  readonly #stopping = new AbortController();

  constructor(orm: MikroORM, box: SecretBox, settings: WebhookSettings, log: (line: string) => void) {
    this.#orm = orm;
    this.#box = box;
    this.#s = settings;
    this.#log = log;
  }

  async start(databaseUrl: string): Promise<void> {
    await this.#listen(databaseUrl);
    this.#timer = setInterval(() => {
      this.kick();
      void this.#purge().catch((err: unknown) => this.#log(`webhooks: purging old events failed: ${String(err)}`));
    }, this.#s.pollMs);
    this.#timer.unref();
    this.kick();
  }

  async #listen(databaseUrl: string): Promise<void> {
    if (this.#stopped) return;
    const client = new pg.Client({ connectionString: databaseUrl });
    client.on("notification", () => this.kick());
    // Connection lost: the poll keeps delivering meanwhile, and listening resumes on a new connection.
    const lost = () => {
      if (this.#listener !== client || this.#stopped) return;
      this.#listener = undefined;
      this.#listenLater(databaseUrl);
    };
    client.on("error", lost);
    client.on("end", lost);
    try {
      await client.connect();
      await client.query(`LISTEN ${WEBHOOK_CHANNEL}`);
    } catch (err) {
      await client.end().catch(() => undefined);
      throw err;
    }
    if (this.#stopped) return void (await client.end().catch(() => undefined));
    this.#listener = client;
    this.kick(); // whatever was announced while nobody listened
  }

  #listenLater(databaseUrl: string): void {
    setTimeout(() => void this.#listen(databaseUrl).catch(() => this.#listenLater(databaseUrl)), Math.min(this.#s.pollMs, 1000)).unref();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearInterval(this.#timer);
    clearTimeout(this.#wake);
    this.#stopping.abort();
    await this.#listener?.end().catch(() => undefined);
    await Promise.allSettled([...this.#inFlight]);
    if (this.#unrecorded.size) {
      await execIn(this.#orm.em.fork())(`update webhook_delivery set next_attempt_at = now() where id = any(?::uuid[]) and status = 'pending'`, [pgArray([...this.#unrecorded])]).catch(() => undefined);
    }
  }

  /** Looks for due deliveries now (again when a look is already under way). */
  kick(): void {
    if (this.#stopped) return;
    if (this.#draining) {
      this.#again = true;
      return;
    }
    this.#draining = true;
    void this.#drain()
      .catch((err: unknown) => this.#log(`webhooks: claiming deliveries failed: ${String(err)}`))
      .finally(() => {
        this.#draining = false;
        if (this.#again) {
          this.#again = false;
          this.kick();
        }
      });
  }

  async #drain(): Promise<void> {
    while (!this.#stopped) {
      const free = this.#s.concurrency - this.#inFlight.size;
      if (free <= 0) return;
      const jobs = await this.#claim(free);
      for (const job of jobs) {
        this.#unrecorded.add(job.id);
        const p: Promise<void> = this.#deliver(job)
          .catch((err: unknown) => this.#log(`webhooks: delivery ${job.id} failed to record: ${String(err)}`))
          .finally(() => {
            this.#inFlight.delete(p);
            this.kick();
          });
        this.#inFlight.add(p);
      }
      if (jobs.length < free) return this.#wakeAtNextDue();
    }
  }

  async #wakeAtNextDue(): Promise<void> {
    const rows = (await execIn(this.#orm.em.fork())(
      `select extract(epoch from min(d.next_attempt_at) - now()) * 1000 as ms
         from webhook_delivery d join webhook_endpoint e on e.id = d.endpoint_id where d.status = 'pending' and e.enabled`,
      [],
    )) as Array<{ ms: string | number | null }>;
    const ms = rows[0]?.ms;
    if (ms === null || ms === undefined || this.#stopped) return;
    clearTimeout(this.#wake);
    this.#wake = setTimeout(() => this.kick(), Math.min(Math.max(0, Number(ms)), this.#s.pollMs) + 5);
    this.#wake.unref();
  }

  /** At most hourly: events older than RETENTION_DAYS with nothing left to deliver go, their attempts with them. */
  async #purge(): Promise<void> {
    if (Date.now() - this.#purgedAt < 3600_000) return;
    this.#purgedAt = Date.now();
    await execIn(this.#orm.em.fork())(
      `delete from webhook_message m where m.created_at < now() - ? * interval '1 day'
          and not exists (select 1 from webhook_delivery d where d.message_id = m.id and d.status = 'pending')`,
      [RETENTION_DAYS],
    );
  }

  #claim(limit: number): Promise<Claimed[]> {
    const leaseMs = this.#s.timeoutMs + 10_000;
    return execIn(this.#orm.em.fork())(
      `with due as (
         select d.id from webhook_delivery d join webhook_endpoint e on e.id = d.endpoint_id
          where d.status = 'pending' and d.next_attempt_at <= now() and e.enabled
          order by d.next_attempt_at limit ? for update of d skip locked),
       claimed as (
         update webhook_delivery d set next_attempt_at = now() + ? * interval '1 millisecond'
           from due where d.id = due.id
         returning d.id, d.message_id, d.endpoint_id, d.attempts)
       select c.id, c.message_id, c.endpoint_id, c.attempts, m.event_type, m.body,
              e.url, e.secret, e.previous_secret, e.previous_secret_until
         from claimed c join webhook_message m on m.id = c.message_id join webhook_endpoint e on e.id = c.endpoint_id`,
      [limit, leaseMs],
    ) as Promise<Claimed[]>;
  }

  async #deliver(job: Claimed): Promise<void> {
    const now = new Date();
    const secrets = [this.#open(job.secret)];
    // While a rotation's grace lasts, the old secret signs too: a second `v1,` signature.
    if (job.previous_secret && job.previous_secret_until && dateOf(job.previous_secret_until) > now) secrets.push(this.#open(job.previous_secret));
    if (!secrets[0]) {
      // Sealed under another key (SANDBAR_ENCRYPTION_KEY changed): nothing can be signed; rotating the secret mends it.
      return this.#record(job, { error: "the endpoint's signing secret cannot be read (was SANDBAR_ENCRYPTION_KEY changed?); rotate the secret", durationMs: 0 }, now);
    }
    const signature = secrets.flatMap((s) => (s ? [new Webhook(s).sign(job.message_id, now, job.body)] : [])).join(" ");
    const result = await send(
      job.url,
      {
        "content-type": "application/json",
        "user-agent": "Sandbar-Webhooks/1",
        "webhook-id": job.message_id,
        "webhook-timestamp": String(Math.floor(now.getTime() / 1000)),
        "webhook-signature": signature,
      },
      job.body,
      { timeoutMs: this.#s.timeoutMs, allowPrivate: this.#s.allowPrivate, signal: this.#stopping.signal },
    );
    if (this.#stopping.signal.aborted) return;
    await this.#record(job, result, now);
  }

  /** A sealed secret in clear, or undefined when it was sealed under another key. */
  #open(sealed: string): string | undefined {
    try {
      return this.#box.open(sealed);
    } catch {
      return undefined;
    }
  }

  /** The attempt, the delivery's next step, and the endpoint's failure record, in one transaction. */
  async #record(job: Claimed, r: SendResult, startedAt: Date): Promise<void> {
    const attempt = job.attempts + 1;
    const success = r.error === undefined;
    const delay = this.#s.retryDelaysMs[attempt - 1];
    const next = success || delay === undefined ? null : new Date(Date.now() + delay);
    const status = success ? "succeeded" : next ? "pending" : "failed";
    this.#unrecorded.delete(job.id);
    await this.#orm.em.fork().transactional(async (em) => {
      const exec = execIn(em);
      // The endpoint's row first, as a delete of the endpoint takes it (then cascades to its
      // deliveries): locking the delivery first would deadlock against that delete.
      const endpoint = (await exec(`select id from webhook_endpoint where id = ? for no key update`, [job.endpoint_id])) as unknown[];
      if (!endpoint.length) return;
      // Gone when its endpoint was deleted meanwhile: nothing to record.
      const updated = (await exec(
        `update webhook_delivery set status = ?, attempts = ?, next_attempt_at = coalesce(?, next_attempt_at) where id = ? and status = 'pending' returning id`,
        [status, attempt, next, job.id],
      )) as unknown[];
      if (!updated.length) return;
      await exec(
        `insert into webhook_attempt (id, delivery_id, endpoint_id, message_id, event_type, attempt, status_code, success, duration_ms, error, response_body, next_attempt_at, created_at)
         values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        [randomUUID(), job.id, job.endpoint_id, job.message_id, job.event_type, attempt, r.statusCode ?? null, success, r.durationMs, r.error ?? null, r.responseBody ?? null, next, startedAt],
      );
      if (success) await exec(`update webhook_endpoint set failing_since = null where id = ? and failing_since is not null`, [job.endpoint_id]);
      else await this.#failed(exec, job.endpoint_id, startedAt, status === "failed");
    });
  }

  /**
   * Sustained failure: when an event has exhausted its attempts and nothing has reached the
   * endpoint for `disableAfterMs`, the endpoint is disabled and its queued deliveries dropped.
   */
  async #failed(exec: Exec, endpointId: string, at: Date, exhausted: boolean): Promise<void> {
    const rows = (await exec(`update webhook_endpoint set failing_since = coalesce(failing_since, ?) where id = ? returning failing_since`, [at, endpointId])) as Array<{ failing_since: Date | string }>;
    if (!exhausted || !rows[0]) return;
    const since = dateOf(rows[0].failing_since);
    if (Date.now() - since.getTime() < this.#s.disableAfterMs) return;
    const reason = `Disabled after sustained delivery failure: every attempt since ${since.toISOString()} failed and an event exhausted its ${this.#s.retryDelaysMs.length + 1} attempts`;
    await exec(`update webhook_endpoint set enabled = false, disabled_reason = ?, updated_at = now() where id = ? and enabled`, [reason, endpointId]);
    await exec(`update webhook_delivery set status = 'cancelled' where endpoint_id = ? and status = 'pending'`, [endpointId]);
    this.#log(`webhooks: endpoint ${endpointId} disabled after sustained delivery failure`);
  }
}
