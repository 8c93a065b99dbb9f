import { sql } from 'kysely';
import { z } from 'zod';
import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';
import { newId } from '../domain/ids.ts';
import { outboxHead } from '../events/outbox.ts';
import { newWebhookSecret } from '../events/webhook-signature.ts';
import { defineMethod } from './method.ts';

const manageAction = 'compute:webhooks:manage';
const readAction = 'compute:webhooks:read';

const typePattern = z
  .string()
  .regex(
    /^[a-z][a-z0-9-]*(\.[a-z0-9-]+)*(\.\*)?$/,
    'an event type such as reservation.active, or reservation.*',
  );

const webhookSchema = z.object({
  id: z.string(),
  tenantId: z.string(),
  url: z.string(),
  eventTypes: z.array(z.string()),
  description: z.string(),
  createdAt: z.number().int(),
});

async function decide(deps: Deps, principal: Principal, action: string, tenantId: string, requestId: string) {
  await deps.iam.require(
    principal,
    action,
    { type: 'compute-tenant', id: tenantId, tenantId },
    { requestId },
  );
}

function toWebhook(row: {
  id: string;
  tenant_id: string;
  url: string;
  event_types: string[];
  description: string;
  created_at: Date;
}) {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    url: row.url,
    eventTypes: row.event_types,
    description: row.description,
    createdAt: row.created_at.getTime(),
  };
}

const create = defineMethod({
  summary:
    'Subscribes an HTTPS endpoint to the tenant’s events from now on. Answers the signing secret once: every delivery carries webhook-id, webhook-timestamp and webhook-signature (HMAC-SHA256, Standard Webhooks).',
  action: manageAction,
  input: z.strictObject({
    tenantId: z.string().min(1),
    url: z
      .string()
      .max(2000)
      .refine((value) => URL.canParse(value) && /^https?:$/.test(new URL(value).protocol), 'an http(s) URL'),
    eventTypes: z.array(typePattern).max(100).default([]),
    description: z.string().max(500).default(''),
  }),
  output: webhookSchema.extend({ secret: z.string() }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, manageAction, input.tenantId, requestId);
    const head = await outboxHead(deps.db);
    const secret = newWebhookSecret();
    const row = await deps.db
      .insertInto('webhook_subscriptions')
      .values({
        id: newId('hook'),
        tenant_id: input.tenantId,
        url: input.url,
        secret,
        event_types: input.eventTypes,
        description: input.description,
        created_by: principal.identityId,
        cursor_xid: head.xid,
        cursor_seq: head.seq,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    return { ...toWebhook(row), secret };
  },
});

const list = defineMethod({
  summary: 'The tenant’s webhooks (without their secrets).',
  action: readAction,
  input: z.strictObject({ tenantId: z.string().min(1) }),
  output: z.object({ items: z.array(webhookSchema) }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, readAction, input.tenantId, requestId);
    const rows = await deps.db
      .selectFrom('webhook_subscriptions')
      .selectAll()
      .where('tenant_id', '=', input.tenantId)
      .where('deleted_at', 'is', null)
      .orderBy('created_at')
      .execute();
    return { items: rows.map(toWebhook) };
  },
});

const remove = defineMethod({
  summary: 'Stops a webhook; its delivery records stay readable.',
  action: manageAction,
  input: z.strictObject({ tenantId: z.string().min(1), webhookId: z.string().min(1) }),
  output: z.object({ id: z.string(), deleted: z.literal(true) }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, manageAction, input.tenantId, requestId);
    const row = await deps.db
      .updateTable('webhook_subscriptions')
      .set({ deleted_at: sql<Date>`compute_now()` as never, lease_owner: null, lease_until: null })
      .where('id', '=', input.webhookId)
      .where('tenant_id', '=', input.tenantId)
      .where('deleted_at', 'is', null)
      .returning('id')
      .executeTakeFirst();
    if (!row)
      throw new ComputeError(
        'NOT_FOUND',
        `webhook ${input.webhookId} does not exist in tenant ${input.tenantId}`,
      );
    return { id: row.id, deleted: true as const };
  },
});

const deliveries = defineMethod({
  summary:
    'Every delivery attempt of a webhook, newest first: the event, the attempt, the outcome, the status.',
  action: readAction,
  input: z.strictObject({
    tenantId: z.string().min(1),
    webhookId: z.string().min(1),
    limit: z.number().int().min(1).max(500).default(100),
  }),
  output: z.object({
    items: z.array(
      z.object({
        id: z.string(),
        eventId: z.string(),
        eventSeq: z.number().int(),
        eventType: z.string(),
        attempt: z.number().int(),
        outcome: z.enum(['succeeded', 'retrying', 'failed']),
        statusCode: z.number().int().nullable(),
        error: z.string().nullable(),
        durationMs: z.number().int(),
        createdAt: z.number().int(),
      }),
    ),
  }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, readAction, input.tenantId, requestId);
    const hook = await deps.db
      .selectFrom('webhook_subscriptions')
      .select('id')
      .where('id', '=', input.webhookId)
      .where('tenant_id', '=', input.tenantId)
      .executeTakeFirst();
    if (!hook)
      throw new ComputeError(
        'NOT_FOUND',
        `webhook ${input.webhookId} does not exist in tenant ${input.tenantId}`,
      );
    const rows = await deps.db
      .selectFrom('webhook_deliveries')
      .selectAll()
      .where('subscription_id', '=', hook.id)
      .orderBy('created_at', 'desc')
      .orderBy('id', 'desc')
      .limit(input.limit)
      .execute();
    return {
      items: rows.map((r) => ({
        id: r.id,
        eventId: r.event_id,
        eventSeq: Number(r.event_seq),
        eventType: r.event_type,
        attempt: r.attempt,
        outcome: r.outcome,
        statusCode: r.status_code,
        error: r.error,
        durationMs: r.duration_ms,
        createdAt: r.created_at.getTime(),
      })),
    };
  },
});

export const webhookMethods = { create, list, delete: remove, deliveries };
