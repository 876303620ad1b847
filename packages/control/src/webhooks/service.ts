import { randomBytes, randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { type ListValue, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import {
  type WebhookDeliveryAttempt,
  WebhookDeliveryAttemptSchema,
  type WebhookEndpoint,
  WebhookEndpointSchema,
  type WebhookService,
} from "@sandbar/protocol/gen/sandbar/control/v1/webhook_pb.js";
import type { SecretBox } from "../auth/secret-box.ts";
import { dateOf, type Exec, execIn, pgArray } from "../db/exec.ts";
import { checkDestination } from "./destinations.ts";
import { EVENT_TYPES, recordTestEvent } from "./events.ts";
import type { WebhookSettings } from "./settings.ts";

// An organization's webhook endpoints: made, changed and removed by owners, read by members.
// The signing secret is answered once (on create and on rotation) and stored sealed.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const KNOWN = new Set<string>(EVENT_TYPES);
/** How long a rotated-out secret keeps signing beside the new one. */
const ROTATION_GRACE_MS = 24 * 3600_000;
const MAX_ENDPOINTS = 50;
const MAX_DESCRIPTION = 1024;

interface EndpointRow {
  id: string;
  organization_id: string;
  url: string;
  description: string;
  event_types: string[];
  enabled: boolean;
  disabled_reason: string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

interface AttemptRow {
  id: string;
  message_id: string;
  event_type: string;
  attempt: number;
  status_code: number | null;
  success: boolean;
  duration_ms: number;
  error: string | null;
  response_body: string | null;
  next_attempt_at: Date | string | null;
  created_at: Date | string;
}

const COLUMNS = `id, organization_id, url, description, event_types, enabled, disabled_reason, created_at, updated_at`;

/** `whsec_` + base64 of 32 random bytes: the form the `standardwebhooks` verifier takes. */
const newSecret = () => "whsec_" + randomBytes(32).toString("base64");

export function webhookService(orm: MikroORM, box: SecretBox, settings: WebhookSettings): Partial<ServiceImpl<typeof WebhookService>> {
  const exec0 = () => execIn(orm.em.fork());
  const notFound = (id: string) => errors.notFound(`Webhook endpoint with ID ${id} not found`);

  async function endpoint(exec: Exec, organizationId: string, id: string, lock = false): Promise<EndpointRow> {
    if (!UUID.test(id)) throw notFound(id);
    const rows = (await exec(`select ${COLUMNS} from webhook_endpoint where id = ? and organization_id = ?${lock ? " for update" : ""}`, [id, organizationId])) as EndpointRow[];
    if (!rows[0]) throw notFound(id);
    return rows[0];
  }

  async function checkUrl(url: string): Promise<void> {
    const problem = await checkDestination(url, settings.allowPrivate);
    if (problem) throw errors.invalidArgument(problem);
  }

  return {
    async createWebhookEndpoint(req) {
      const url = req.url.trim();
      await checkUrl(url);
      const description = checkDescription(req.description ?? "");
      const eventTypes = checkEventTypes(req.eventTypes);
      const secret = newSecret();
      const row = await orm.em.fork().transactional(async (tx) => {
        const exec = execIn(tx);
        // Serializes creates in one organization, so the count below holds.
        await exec(`select id from organization where id = ? for update`, [req.organizationId]);
        const [{ n }] = (await exec(`select count(*)::int as n from webhook_endpoint where organization_id = ?`, [req.organizationId])) as Array<{ n: number }>;
        if (n >= MAX_ENDPOINTS) throw errors.invalidArgument(`An organization may have at most ${MAX_ENDPOINTS} webhook endpoints`);
        const rows = (await exec(
          `insert into webhook_endpoint (id, organization_id, url, description, event_types, enabled, secret) values (?, ?, ?, ?, ?::text[], ?, ?) returning ${COLUMNS}`,
          [randomUUID(), req.organizationId, url, description, pgArray(eventTypes), req.enabled ?? true, box.seal(secret)],
        )) as EndpointRow[];
        return rows[0]!;
      });
      return { endpoint: toEndpoint(row), secret };
    },

    async listWebhookEndpoints(req) {
      const rows = (await exec0()(`select ${COLUMNS} from webhook_endpoint where organization_id = ? order by created_at, id`, [req.organizationId])) as EndpointRow[];
      return { items: rows.map(toEndpoint) };
    },

    async getWebhookEndpoint(req) {
      return toEndpoint(await endpoint(exec0(), req.organizationId, req.endpointId));
    },

    async updateWebhookEndpoint(req) {
      const url = req.url === undefined ? undefined : req.url.trim();
      if (!UUID.test(req.endpointId)) throw notFound(req.endpointId);
      if (url !== undefined) await checkUrl(url);
      const description = req.description === undefined ? undefined : checkDescription(req.description);
      const eventTypes = req.eventTypes === undefined ? undefined : checkEventTypes(stringsOf(req.eventTypes));
      const row = await orm.em.fork().transactional(async (tx) => {
        const exec = execIn(tx);
        const cur = await endpoint(exec, req.organizationId, req.endpointId, true);
        // Turning an endpoint back on starts its failure record afresh.
        const enabling = req.enabled === true && !cur.enabled;
        const rows = (await exec(
          `update webhook_endpoint set url = ?, description = ?, event_types = ?::text[], enabled = ?,
                  disabled_reason = case when ? then null else disabled_reason end,
                  failing_since = case when ? then null else failing_since end, updated_at = now()
            where id = ? returning ${COLUMNS}`,
          [url ?? cur.url, description ?? cur.description, pgArray(eventTypes ?? cur.event_types), req.enabled ?? cur.enabled, enabling || req.enabled === false, enabling, cur.id],
        )) as EndpointRow[];
        return rows[0]!;
      });
      return toEndpoint(row);
    },

    async deleteWebhookEndpoint(req) {
      if (!UUID.test(req.endpointId)) throw notFound(req.endpointId);
      const rows = (await exec0()(`delete from webhook_endpoint where id = ? and organization_id = ? returning id`, [req.endpointId, req.organizationId])) as unknown[];
      if (!rows.length) throw notFound(req.endpointId);
      return {};
    },

    async rotateWebhookEndpointSecret(req) {
      const secret = newSecret();
      await orm.em.fork().transactional(async (tx) => {
        const exec = execIn(tx);
        const cur = await endpoint(exec, req.organizationId, req.endpointId, true);
        await exec(
          `update webhook_endpoint set previous_secret = secret, previous_secret_until = ?, secret = ?, updated_at = now() where id = ?`,
          [new Date(Date.now() + ROTATION_GRACE_MS), box.seal(secret), cur.id],
        );
      });
      return { secret };
    },

    async sendWebhookTestEvent(req) {
      const messageId = await orm.em.fork().transactional(async (tx) => {
        const exec = execIn(tx);
        const cur = await endpoint(exec, req.organizationId, req.endpointId, true);
        if (!cur.enabled) throw errors.failedPrecondition("Webhook endpoint is disabled; enable it to send a test event");
        return recordTestEvent(exec, req.organizationId, cur.id);
      });
      return { messageId };
    },

    async listWebhookDeliveryAttempts(req) {
      const page = req.page ?? 1;
      const limit = req.limit ?? 100;
      if (!Number.isInteger(page) || page < 1) throw errors.invalidArgument("page must be a positive integer");
      if (!Number.isInteger(limit) || limit < 1 || limit > 200) throw errors.invalidArgument("limit must be an integer from 1 to 200");
      const exec = exec0();
      await endpoint(exec, req.organizationId, req.endpointId);
      const [{ n }] = (await exec(`select count(*)::int as n from webhook_attempt where endpoint_id = ?`, [req.endpointId])) as Array<{ n: number }>;
      const rows = (await exec(
        `select id, message_id, event_type, attempt, status_code, success, duration_ms, error, response_body, next_attempt_at, created_at
           from webhook_attempt where endpoint_id = ? order by created_at desc, id desc limit ? offset ?`,
        [req.endpointId, limit, (page - 1) * limit],
      )) as AttemptRow[];
      return { items: rows.map(toAttempt), total: n, page, totalPages: Math.ceil(n / limit) };
    },
  };
}

function checkDescription(value: string): string {
  const v = value.trim();
  if (v.length > MAX_DESCRIPTION) throw errors.invalidArgument(`description must be shorter than or equal to ${MAX_DESCRIPTION} characters`);
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(v)) throw errors.invalidArgument("description must not contain control characters");
  return v;
}

function checkEventTypes(types: readonly string[]): string[] {
  const unknown = types.filter((t) => !KNOWN.has(t));
  if (unknown.length) throw errors.invalidArgument(`eventTypes must each be one of the following values: ${EVENT_TYPES.join(", ")} (got ${unknown.map((t) => JSON.stringify(t)).join(", ")})`);
  return [...new Set(types)];
}

/** A JSON array of strings (the update's eventTypes), a ListValue message over gRPC and REST alike. */
function stringsOf(list: ListValue): string[] {
  return list.values.map((v) => {
    if (v.kind.case !== "stringValue") throw errors.invalidArgument("eventTypes must be an array of strings");
    return v.kind.value;
  });
}

function toEndpoint(r: EndpointRow): WebhookEndpoint {
  return create(WebhookEndpointSchema, {
    id: r.id,
    organizationId: r.organization_id,
    url: r.url,
    description: r.description,
    eventTypes: r.event_types,
    enabled: r.enabled,
    disabledReason: r.disabled_reason ?? undefined,
    createdAt: timestampFromDate(dateOf(r.created_at)),
    updatedAt: timestampFromDate(dateOf(r.updated_at)),
  });
}

function toAttempt(r: AttemptRow): WebhookDeliveryAttempt {
  return create(WebhookDeliveryAttemptSchema, {
    id: r.id,
    messageId: r.message_id,
    eventType: r.event_type,
    attempt: r.attempt,
    statusCode: r.status_code ?? undefined,
    success: r.success,
    durationMs: r.duration_ms,
    error: r.error ?? undefined,
    responseBody: r.response_body ?? undefined,
    nextAttemptAt: r.next_attempt_at ? timestampFromDate(dateOf(r.next_attempt_at)) : undefined,
    createdAt: timestampFromDate(dateOf(r.created_at)),
  });
}
