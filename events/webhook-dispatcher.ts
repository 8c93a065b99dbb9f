import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { newId } from '../domain/ids.ts';
import { type OutboxEvent, outboxHead, readOutbox } from './outbox.ts';

import { signatureHeaders, signWebhook } from './webhook-signature.ts';

export interface WebhookDispatcherOptions {
  /** Names this dispatcher in leases (several processes may run one each). */
  owner?: string;
  fetch?: typeof fetch;
  /** How often subscriptions are claimed and checked for new events. */
  pollMs?: number;
  /** Per-request deadline: a hanging endpoint is cut off after this long. */
  timeoutMs?: number;
  /** Attempts per event before it is recorded `failed` and the subscription moves on. */
  maxAttempts?: number;
  /** Wait before attempt n+1 after n failures; default 2^(n-1) s, at most 10 min. */
  backoffMs?: (failures: number) => number;
  /** How long a claim on a subscription lasts without renewal. */
  leaseMs?: number;
  /** Now, in Unix seconds, for the signature timestamp (the receiver's clock is wall time). */
  nowSeconds?: () => number;
}

interface Subscription {
  id: string;
  tenant_id: string;
  url: string;
  secret: string;
  event_types: string[];
  cursor_xid: string;
  cursor_seq: string;
  attempts: number;
}

const defaultBackoff = (failures: number) => Math.min(2 ** (failures - 1) * 1000, 600_000);

/**
 * Delivers outbox events to each tenant's webhooks: in order per subscription, signed
 * (webhook-signature.ts), each attempt recorded in webhook_deliveries, retried with back-off.
 * Every subscription is worked by its own loop with its own deadline per request, so an endpoint
 * that fails or hangs delays only itself: never the API, the outbox or other subscribers. No
 * transaction is held open across a request.
 */
export function startWebhookDispatcher(
  deps: { db: Db; log: Logger },
  options: WebhookDispatcherOptions = {},
) {
  const { db } = deps;
  const log = deps.log.child({ component: 'webhooks' });
  const owner = options.owner ?? newId('wf');
  const doFetch = options.fetch ?? globalThis.fetch;
  const pollMs = options.pollMs ?? 500;
  const timeoutMs = options.timeoutMs ?? 10_000;
  const maxAttempts = options.maxAttempts ?? 8;
  const backoffMs = options.backoffMs ?? defaultBackoff;
  const leaseMs = options.leaseMs ?? 60_000;
  const nowSeconds = options.nowSeconds ?? (() => Math.floor(Date.now() / 1000));
  const stopping = new AbortController();
  const running = new Map<string, Promise<void>>();

  async function attempt(subscription: Subscription, event: OutboxEvent, attemptNo: number) {
    const body = JSON.stringify(event);
    const timestamp = nowSeconds();
    const started = performance.now();
    let statusCode: number | null = null;
    let error: string | null = null;
    // A timer of our own: a timeout signal combined with AbortSignal.any can be collected before
    // it fires on Node 20, which would let a hanging endpoint hold its loop for ever.
    const deadline = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      deadline.abort();
    }, timeoutMs);
    const onStop = () => deadline.abort();
    stopping.signal.addEventListener('abort', onStop, { once: true });
    try {
      const response = await doFetch(subscription.url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'user-agent': 'better-compute-webhooks/1',
          [signatureHeaders.id]: event.id,
          [signatureHeaders.timestamp]: String(timestamp),
          [signatureHeaders.signature]: signWebhook(subscription.secret, event.id, timestamp, body),
          'x-better-compute-event': event.type,
        },
        body,
        redirect: 'manual',
        signal: deadline.signal,
      });
      statusCode = response.status;
      await response.body?.cancel().catch(() => {});
      if (statusCode < 200 || statusCode >= 300) error = `HTTP ${statusCode}`;
    } catch (cause) {
      error = timedOut
        ? `no answer within ${timeoutMs} ms`
        : `${(cause as Error).message}${(cause as Error).cause ? `: ${((cause as Error).cause as Error).message}` : ''}`;
    } finally {
      clearTimeout(timer);
      stopping.signal.removeEventListener('abort', onStop);
    }
    const ok = error === null;
    const outcome = ok ? 'succeeded' : attemptNo >= maxAttempts ? 'failed' : 'retrying';
    const durationMs = Math.round(performance.now() - started);
    await db.transaction().execute(async (trx) => {
      await trx
        .insertInto('webhook_deliveries')
        .values({
          id: newId('hook'),
          subscription_id: subscription.id,
          event_id: event.id,
          event_seq: event.seq,
          event_type: event.type,
          attempt: attemptNo,
          outcome,
          status_code: statusCode,
          error,
          duration_ms: durationMs,
        })
        .execute();
      if (outcome === 'retrying') {
        await sql`
          UPDATE webhook_subscriptions
          SET attempts = ${attemptNo},
              next_attempt_at = compute_now() + make_interval(secs => ${backoffMs(attemptNo) / 1000}),
              updated_at = compute_now()
          WHERE id = ${subscription.id} AND lease_owner = ${owner}`.execute(trx);
      }
    });
    if (outcome !== 'retrying') {
      log.debug(
        { webhookId: subscription.id, eventId: event.id, outcome, attempt: attemptNo },
        'webhook delivery',
      );
    } else {
      log.info(
        { webhookId: subscription.id, eventId: event.id, attempt: attemptNo, error },
        'webhook delivery failed',
      );
    }
    return outcome;
  }

  /** Delivers what is due to one subscription, in order, until it is caught up or must wait. */
  async function drain(subscription: Subscription) {
    let cursor = { xid: subscription.cursor_xid, seq: Number(subscription.cursor_seq) };
    let attempts = subscription.attempts;
    while (!stopping.signal.aborted) {
      // The head first, then the read: when nothing up to the head is of interest, the cursor
      // moves to the head, so later passes never scan the skipped events again.
      const head = await outboxHead(db);
      const page = await readOutbox(
        db,
        cursor,
        { tenantId: subscription.tenant_id, types: subscription.event_types },
        20,
      );
      if (page.events.length === 0) {
        if (head.xid !== cursor.xid || head.seq !== cursor.seq) {
          await sql`
            UPDATE webhook_subscriptions SET cursor_xid = ${head.xid}::xid8, cursor_seq = ${head.seq}
            WHERE id = ${subscription.id} AND lease_owner = ${owner} AND attempts = 0
              AND (cursor_xid, cursor_seq) < (${head.xid}::xid8, ${head.seq}::bigint)`.execute(db);
        }
        return;
      }
      for (const event of page.events) {
        if (stopping.signal.aborted) return;
        const outcome = await attempt(subscription, event, attempts + 1);
        if (outcome === 'retrying') return;
        attempts = 0;
        const seq = event.seq;
        const { rows } = await sql<{ xid: string }>`
          UPDATE webhook_subscriptions AS s
          SET cursor_xid = o.xid, cursor_seq = o.seq, attempts = 0, next_attempt_at = NULL,
              updated_at = compute_now()
          FROM outbox_events AS o
          WHERE s.id = ${subscription.id} AND s.lease_owner = ${owner} AND o.seq = ${seq}
          RETURNING o.xid::text AS xid`.execute(db);
        if (rows.length === 0) return; // the lease moved on, or the subscription was deleted
        cursor = { xid: rows[0]!.xid, seq };
      }
    }
  }

  async function tick() {
    const { rows } = await sql<Subscription>`
      UPDATE webhook_subscriptions
      SET lease_owner = ${owner}, lease_until = compute_now() + make_interval(secs => ${leaseMs / 1000})
      WHERE deleted_at IS NULL
        AND (lease_until IS NULL OR lease_until < compute_now() OR lease_owner = ${owner})
        AND (next_attempt_at IS NULL OR next_attempt_at <= compute_now())
      RETURNING id, tenant_id, url, secret, event_types, cursor_xid::text AS cursor_xid, cursor_seq, attempts`.execute(
      db,
    );
    for (const subscription of rows) {
      if (running.has(subscription.id)) continue;
      const work = drain(subscription)
        .catch((err: unknown) => log.error({ err, webhookId: subscription.id }, 'webhook dispatch failed'))
        .finally(() => running.delete(subscription.id));
      running.set(subscription.id, work);
    }
  }

  const loop = (async () => {
    while (!stopping.signal.aborted) {
      await tick().catch((err: unknown) => log.error({ err }, 'webhook dispatcher tick failed'));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, pollMs);
        stopping.signal.addEventListener(
          'abort',
          () => {
            clearTimeout(timer);
            resolve();
          },
          { once: true },
        );
      });
    }
  })();

  return {
    owner,
    /** Stops claiming, cuts off requests in flight and waits for every loop to end. */
    async stop() {
      stopping.abort();
      await loop;
      await Promise.allSettled([...running.values()]);
      await sql`UPDATE webhook_subscriptions SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = ${owner}`
        .execute(db)
        .catch(() => {});
    },
  };
}

export type WebhookDispatcher = ReturnType<typeof startWebhookDispatcher>;
