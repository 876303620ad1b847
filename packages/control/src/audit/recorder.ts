import { randomUUID } from "node:crypto";
import type { DescMethod } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { type ConnectError, httpStatusOf, type Route } from "@sandbar/protocol";
import { authOf, callKey } from "../call/call.ts";
import { statusOverride } from "../gateway/http-io.ts";
import { requestMetadata, storable } from "./request-metadata.ts";

/** How a call ended: its result, or the error it answers. */
interface CallOutcome {
  result?: unknown;
  error?: ConnectError;
}

/** Completes a call's entry; never throws (a lost outcome must not fail a call that ran). */
export type CompleteCall = (outcome: CallOutcome) => Promise<void>;

/** What the call chain (call/chain.ts) calls around a state-changing call. */
export interface CallRecorder {
  /** Writes the entry before the handler runs; a failure here fails the call (as the reference). */
  begin(method: DescMethod, route: Route, input: unknown, ctx: HandlerContext): Promise<CompleteCall>;
}

/** The reference's limit on a stored error message. */
const MAX_ERROR = 10_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const SOURCE_HEADERS = ["x-sandbar-source", "x-daytona-source"];

const cut = (s: string | null | undefined, max: number): string | null => (s ? storable(s.slice(0, max)) : null);
const uuidOrNull = (v: unknown): string | null => (typeof v === "string" && UUID.test(v) ? v : null);

function stringField(obj: unknown, name: string): string | undefined {
  const v = typeof obj === "object" && obj !== null ? (obj as Record<string, unknown>)[name] : undefined;
  return typeof v === "string" && v !== "" ? v : undefined;
}

/**
 * Writes the audit log: a pending row before the handler runs, completed with the outcome after
 * (HTTP status, error message, the target and organization a result names). A row a crash left
 * pending is closed with status 0 by the retention pass.
 */
export class AuditRecorder implements CallRecorder {
  readonly #orm: MikroORM;
  readonly #log: (line: string) => void;

  constructor(orm: MikroORM, log: (line: string) => void) {
    this.#orm = orm;
    this.#log = log;
  }

  async begin(method: DescMethod, route: Route, input: unknown, ctx: HandlerContext): Promise<CompleteCall> {
    const audit = route.audit!;
    const { principal, organizationId } = authOf(ctx);
    const call = ctx.values.get(callKey);
    const fieldName = audit.targetId ? method.input.fields.find((f) => f.name === audit.targetId)?.localName : undefined;
    let target = fieldName ? stringField(input, fieldName) : undefined;
    // Toolbox calls name their sandbox in the path or the RPC metadata, not in the request (and
    // their results' ids are the agent's: sessions, terminals).
    const routed = !target && audit.targetType === "sandbox" ? call?.sandboxId : undefined;
    target ??= routed;
    const request = input === undefined ? undefined : requestMetadata(method.input, input);
    const metadata = { protocol: ctx.protocolName, ...(request ? { body: request } : {}) };
    const id = randomUUID();
    // Committed without waiting for its WAL flush (as the outcome below): anything the handler
    // then commits durably flushes the WAL up to its own commit, this row included, so no change
    // outlives its entry; what a crash of PostgreSQL itself can lose is the entry of a call that
    // had changed nothing durable yet. The row is visible to every process before the handler
    // runs, and survives a crash of this one. Two statements in one query are one implicit
    // transaction, which SET LOCAL applies to and an error ends.
    await this.#orm.em.getConnection().execute(
      `set local synchronous_commit = off;
       insert into "audit_log" ("id", "actor_id", "actor_email", "actor_api_key_prefix", "actor_api_key_suffix", "organization_id",
        "action", "target_type", "target_id", "ip_address", "user_agent", "source", "metadata")
       values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?::jsonb)`,
      [
        id,
        principal?.userId ?? "",
        principal?.email ?? "",
        principal?.apiKey?.prefix ?? null,
        principal?.apiKey?.suffix ?? null,
        organizationId ?? null,
        audit.action,
        audit.targetType || null,
        cut(target, 1024),
        cut(call?.address, 64),
        cut(ctx.requestHeader.get("user-agent"), 1024),
        cut(SOURCE_HEADERS.map((h) => ctx.requestHeader.get(h)).find(Boolean), 255),
        JSON.stringify(metadata),
      ],
      "run",
    );
    let completed = false;
    return async ({ result, error }) => {
      if (completed) return;
      completed = true;
      const status = error ? (statusOverride(error) ?? httpStatusOf(error.code)) : route.status || 200;
      // A result names what a create made (and the sandbox a name addressed), and the
      // organization it belongs to; an organization acted on outside one is its own.
      const resultTarget = error || routed ? undefined : stringField(result, "id");
      const resultOrganization = error ? null : uuidOrNull(stringField(result, "organizationId"));
      const ownOrganization = !error && audit.targetType === "organization" ? uuidOrNull(resultTarget ?? target) : null;
      try {
        // Also without waiting for the flush: an outcome lost with the database reads as abandoned (status 0).
        await this.#orm.em.getConnection().execute(
          `set local synchronous_commit = off;
           update "audit_log" set "status_code" = ?, "error_message" = ?, "target_id" = coalesce(?, "target_id"),
             "organization_id" = coalesce(?, "organization_id", ?) where "id" = ?`,
          [status, error ? cut(error.rawMessage, MAX_ERROR) : null, cut(resultTarget, 1024), resultOrganization, ownOrganization, id],
          "run",
        );
      } catch (err) {
        this.#log(`audit: could not complete entry ${id} (${audit.action}): ${String(err)}`);
      }
    };
  }
}
