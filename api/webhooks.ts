import { z } from 'zod';
import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';
import { outboxHead } from '../db/events/outbox-read.ts';
import {
  deleteWebhookSubscription,
  insertWebhookSubscriptionWithinCap,
  listWebhookDeliveries,
  listWebhookSubscriptions,
  type WebhookSubscriptionInfo,
  webhookSubscriptionExists,
} from '../db/events/webhooks.ts';
import { ComputeError } from '../domain/errors.ts';
import { eventTypePattern } from '../domain/event-types.ts';
import type { IamAction } from '../domain/iam-actions.ts';
import { newId } from '../domain/ids.ts';
import { webhookDeliveryOutcomes, webhookFailureReasons } from '../domain/webhook-target.ts';
import { newWebhookSecret } from '../events/webhook-signature.ts';
import { assertWebhookTargetAccepted, systemResolver } from '../events/webhook-target-resolve.ts';
import { defineMethod } from './method.ts';
import { apiSealer } from './sealer.ts';

const manageAction = 'compute:webhooks:manage';
const readAction = 'compute:webhooks:read';

const webhookSchema = z.object({
  id: z.string(),
  tenantId: z.string(),
  url: z.string(),
  eventTypes: z.array(z.string()),
  description: z.string(),
  createdAt: z.number().int(),
});

async function decide(
  deps: Deps,
  principal: Principal,
  action: IamAction,
  tenantId: string,
  requestId: string,
) {
  await deps.iam.require(
    principal,
    action,
    { type: 'compute-tenant', id: tenantId, tenantId },
    { requestId },
  );
}

const toWebhook = (hook: WebhookSubscriptionInfo) => ({ ...hook, createdAt: hook.createdAt.getTime() });

function webhookNotFound(input: { tenantId: string; webhookId: string }) {
  return new ComputeError(
    'NOT_FOUND',
    `webhook ${input.webhookId} does not exist in tenant ${input.tenantId}`,
  );
}

const create = defineMethod({
  summary:
    'Subscribes an HTTPS endpoint to the tenant’s events from now on. Answers the signing secret once: every delivery carries webhook-id, webhook-timestamp and webhook-signature (HMAC-SHA256, Standard Webhooks). A target that is not https, or is (or resolves to) a loopback, private, link-local or otherwise non-public address is INVALID_INPUT (checked again at every delivery; redirects are not followed); past BETTER_COMPUTE_WEBHOOKS_PER_TENANT live webhooks, QUOTA_EXCEEDED.',
  action: manageAction,
  input: z.strictObject({
    tenantId: z.string().min(1),
    url: z
      .string()
      .max(2000)
      // The shape only: whether it parses and may be reached is decided with the target (below).
      .regex(/^https?:\/\/\S+$/, 'an http(s) URL'),
    eventTypes: z.array(eventTypePattern).max(100).default([]),
    description: z.string().max(500).default(''),
  }),
  output: webhookSchema.extend({ secret: z.string() }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, manageAction, input.tenantId, requestId);
    const sealer = apiSealer(deps.config, "a webhook's signing secret");
    await assertWebhookTargetAccepted(
      input.url,
      deps.config.BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS ?? [],
      systemResolver,
    );
    const secret = newWebhookSecret();
    const cursor = await outboxHead(deps.db);
    const cap = deps.config.BETTER_COMPUTE_WEBHOOKS_PER_TENANT;
    const { subscription: hook } = await deps.db.transaction().execute((trx) =>
      insertWebhookSubscriptionWithinCap(
        trx,
        {
          id: newId('hook'),
          tenantId: input.tenantId,
          url: input.url,
          // Stored sealed; the caller sees it once, in this answer.
          secret: sealer.seal('webhook-secret', secret),
          eventTypes: input.eventTypes,
          description: input.description,
          createdBy: principal.identityId,
          cursor,
        },
        cap,
      ),
    );
    if (!hook) {
      throw new ComputeError(
        'QUOTA_EXCEEDED',
        `tenant ${input.tenantId} already has ${cap} webhooks, the most a tenant may have: delete one it no longer needs (webhooks.delete) first, or subscribe one endpoint to more event types`,
        { limit: cap, resource: 'webhooks' },
      );
    }
    return { ...toWebhook(hook), secret };
  },
});

const list = defineMethod({
  summary: 'The tenant’s webhooks (without their secrets).',
  action: readAction,
  input: z.strictObject({ tenantId: z.string().min(1) }),
  output: z.object({ items: z.array(webhookSchema) }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, readAction, input.tenantId, requestId);
    return { items: (await listWebhookSubscriptions(deps.db, input.tenantId)).map(toWebhook) };
  },
});

const remove = defineMethod({
  summary: 'Stops a webhook; its delivery records stay readable.',
  action: manageAction,
  input: z.strictObject({ tenantId: z.string().min(1), webhookId: z.string().min(1) }),
  output: z.object({ id: z.string(), deleted: z.literal(true) }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, manageAction, input.tenantId, requestId);
    if (!(await deleteWebhookSubscription(deps.db, input.tenantId, input.webhookId))) {
      throw webhookNotFound(input);
    }
    return { id: input.webhookId, deleted: true as const };
  },
});

const deliveries = defineMethod({
  summary:
    'Every delivery attempt of a webhook, newest first: the event, the attempt, the outcome, the HTTP status the endpoint answered (none for a target that was refused or never answered) and, for a failure, its reason: timeout, connection-failed, tls-failed, refused-target or http-error.',
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
        outcome: z.enum(webhookDeliveryOutcomes),
        statusCode: z.number().int().nullable(),
        error: z.enum(webhookFailureReasons).nullable(),
        durationMs: z.number().int(),
        createdAt: z.number().int(),
      }),
    ),
  }),
  handler: async ({ deps, principal, requestId }, input) => {
    await decide(deps, principal, readAction, input.tenantId, requestId);
    if (!(await webhookSubscriptionExists(deps.db, input.tenantId, input.webhookId))) {
      throw webhookNotFound(input);
    }
    const deliveries = await listWebhookDeliveries(deps.db, input.webhookId, input.limit);
    return { items: deliveries.map((d) => ({ ...d, createdAt: d.createdAt.getTime() })) };
  },
});

export const webhookMethods = { create, list, delete: remove, deliveries };
