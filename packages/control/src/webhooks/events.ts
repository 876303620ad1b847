import { randomUUID } from "node:crypto";
import type { Exec } from "../db/exec.ts";

// The events an organization's webhooks receive, and the one function that records them: into
// the outbox, inside the transaction of the change that causes them. The change and its event
// commit together or not at all, so a crash can neither lose an event nor invent one; delivery
// (worker.ts) happens afterwards, from the outbox.

/** Payload fields of each event kind, beside `event` (the kind) and `timestamp` (ISO time of the change). */
export interface EventPayloads {
  // The reference's kinds (its WebhookEvent), with its payloads.
  "sandbox.created": { id: string; organizationId: string; state: string; sandboxClass: string; createdAt: string };
  "sandbox.state.updated": { id: string; organizationId: string; oldState: string; newState: string; updatedAt: string };
  "snapshot.created": { id: string; name: string; organizationId: string; state: string; createdAt: string };
  "snapshot.state.updated": { id: string; name: string; organizationId: string; oldState: string; newState: string; updatedAt: string };
  "snapshot.removed": { id: string; name: string; organizationId: string; removedAt: string };
  "volume.created": { id: string; name: string; organizationId: string; state: string; createdAt: string };
  "volume.state.updated": { id: string; name: string; organizationId: string; oldState: string; newState: string; updatedAt: string };
  // Ours: membership changes (the reference sends no account-side events).
  "organization.member.added": { organizationId: string; userId: string; role: string; assignedRoleIds: string[] };
  "organization.member.updated": { organizationId: string; userId: string; role: string; assignedRoleIds: string[] };
  "organization.member.removed": { organizationId: string; userId: string };
}

export type EventType = keyof EventPayloads;

export const EVENT_TYPES: readonly EventType[] = [
  "sandbox.created",
  "sandbox.state.updated",
  "snapshot.created",
  "snapshot.state.updated",
  "snapshot.removed",
  "volume.created",
  "volume.state.updated",
  "organization.member.added",
  "organization.member.updated",
  "organization.member.removed",
];

/** Sent to one endpoint on request (SendWebhookTestEvent); not subscribable. */
const TEST_EVENT = "webhook.test";

/** The channel control processes' delivery workers listen on. */
export const WEBHOOK_CHANNEL = "sandbar_webhooks";

/**
 * Records an event for every enabled endpoint of the organization subscribed to its kind. Call it
 * with the Exec of the transaction that makes the change. Nothing is written when no endpoint
 * wants the event. Answers the message id (the webhook-id receivers see), if one was written.
 */
export async function recordEvent<T extends EventType>(exec: Exec, organizationId: string, event: T, fields: EventPayloads[T], at: Date = new Date()): Promise<string | undefined> {
  const targets = `select id from webhook_endpoint where organization_id = ? and enabled and (cardinality(event_types) = 0 or ? = any(event_types))`;
  return enqueue(exec, organizationId, event, { event, timestamp: at.toISOString(), ...fields }, at, targets, [organizationId, event]);
}

/** A test event for one endpoint, whatever its event filter. */
export async function recordTestEvent(exec: Exec, organizationId: string, endpointId: string, at: Date = new Date()): Promise<string> {
  const body = { event: TEST_EVENT, timestamp: at.toISOString(), organizationId, endpointId };
  const id = await enqueue(exec, organizationId, TEST_EVENT, body, at, `select id from webhook_endpoint where id = ? and organization_id = ?`, [endpointId, organizationId]);
  if (!id) throw new Error(`webhook endpoint ${endpointId} vanished while queueing a test event`);
  return id;
}

async function enqueue(exec: Exec, organizationId: string, event: string, payload: object, at: Date, targets: string, targetParams: unknown[]): Promise<string | undefined> {
  const id = randomUUID();
  // One statement: the message only when some endpoint wants it, and one delivery per endpoint.
  const rows = (await exec(
    `with targets as (${targets}),
          message as (insert into webhook_message (id, organization_id, event_type, body, created_at)
                      select ?, ?, ?, ?, ? where exists (select 1 from targets) returning id)
     insert into webhook_delivery (id, message_id, endpoint_id, next_attempt_at)
     select gen_random_uuid(), message.id, targets.id, ? from message, targets returning id`,
    [...targetParams, id, organizationId, event, JSON.stringify(payload), at, at],
  )) as unknown[];
  if (!rows.length) return undefined;
  // Delivered to the listening workers when, and only if, the transaction commits.
  await exec(`select pg_notify(?, '')`, [WEBHOOK_CHANNEL]);
  return id;
}
