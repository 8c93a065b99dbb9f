import { type Config, requireDeploymentSecret } from '../core/config.ts';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { createOutageLog } from '../core/outage-log.ts';
import { type OutboxCursor, type OutboxEvent, outboxHead, readOutbox } from '../db/events/outbox-read.ts';
import {
  advanceWebhookCursor,
  type ClaimedWebhookSubscription,
  claimDueWebhookSubscriptions,
  insertWebhookDelivery,
  openWebhookSecret,
  releaseWebhookLeases,
  renewWebhookLeases,
  scheduleWebhookRetry,
  sealPlaintextWebhookSecrets,
  skipWebhookCursorTo,
} from '../db/events/webhooks.ts';
import { newId } from '../domain/ids.ts';
import { createSealer } from '../domain/sealing.ts';
import type { WebhookFailureReason } from '../domain/webhook-target.ts';
import { compareCursors } from './outbox.ts';
import { postWebhook } from './webhook-post.ts';
import { signatureHeaders, signWebhook } from './webhook-signature.ts';
import { decideWebhookTarget, type HostResolver, systemResolver } from './webhook-target-resolve.ts';

export interface WebhookDispatcherOptions {
  /** Names this dispatcher in leases (several processes may run one each). */
  owner?: string;
  /** Resolves target host names (default: the system's); every address it answers is checked. */
  resolve?: HostResolver;
  /** How often due subscriptions are claimed. */
  pollMs?: number;
  /** Per-request deadline: a hanging endpoint is cut off after this long. */
  timeoutMs?: number;
  /** Attempts per event before it is recorded `failed` and the subscription moves on. */
  maxAttempts?: number;
  /** Wait before attempt n+1 after n failures; default 2^(n-1) s, at most 10 min. */
  backoffMs?: (failures: number) => number;
  /** How long a claim on a subscription lasts without renewal. */
  leaseMs?: number;
  /** Subscriptions worked at once, so also the most claimed per poll (default 16). */
  maxConcurrent?: number;
  /** Deliveries one subscription gets per claim before it goes back in line (default 100). */
  maxEventsPerTurn?: number;
  /** Now, in Unix seconds, for the signature timestamp (the receiver's clock is wall time). */
  nowSeconds?: () => number;
}

const defaultBackoff = (failures: number) => Math.min(2 ** (failures - 1) * 1000, 600_000);

/**
 * Delivers outbox events to each tenant's webhooks: in order per subscription, signed
 * (webhook-signature.ts), each attempt recorded in webhook_deliveries, retried with back-off.
 *
 * Every attempt decides its target first (webhook-target-resolve.ts): https only outside the
 * development allowlist (`BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS`), every resolved address public, and
 * the connection pinned to the address checked; redirects are not followed. A failure is recorded
 * as a closed reason, never the OS message.
 *
 * Database use is bounded whatever the number of webhooks: a poll is at most three statements (the
 * outbox head, a lease renewal, one claim of at most `maxConcurrent` subscriptions that are behind
 * the head, SKIP LOCKED), and at most `maxConcurrent` subscriptions are worked at once, each one
 * statement at a time. An endpoint that fails or hangs delays only itself (and holds one slot for at
 * most its deadline). No transaction is held open across a request.
 *
 * Signing secrets are stored sealed with the deployment secret (BETTER_COMPUTE_SECRET, required:
 * without it this throws before anything starts); the dispatcher opens each one as it claims the
 * subscription, and on start seals any left in plaintext by an older version.
 */
export function startWebhookDispatcher(
  deps: {
    db: Db;
    log: Logger;
    config: Pick<Config, 'BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS' | 'BETTER_COMPUTE_SECRET'>;
  },
  options: WebhookDispatcherOptions = {},
) {
  const { db } = deps;
  const sealer = createSealer(requireDeploymentSecret(deps.config, 'the webhook dispatcher'));
  const log = deps.log.child({ component: 'webhooks' });
  const pollMs = options.pollMs ?? 500;
  // While PostgreSQL is down: one line when it goes, one when it is back, not a stack per poll.
  const outage = createOutageLog(log, `webhook deliveries wait; the dispatcher retries every ${pollMs} ms`);
  const allowHosts = deps.config.BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS ?? [];
  const owner = options.owner ?? newId('wf');
  const resolve = options.resolve ?? systemResolver;
  const timeoutMs = options.timeoutMs ?? 10_000;
  const maxAttempts = options.maxAttempts ?? 8;
  const backoffMs = options.backoffMs ?? defaultBackoff;
  const leaseMs = options.leaseMs ?? 60_000;
  const maxConcurrent = options.maxConcurrent ?? 16;
  const maxEventsPerTurn = options.maxEventsPerTurn ?? 100;
  // wall time: the signature's timestamp is checked against the receiver's own clock
  const nowSeconds = options.nowSeconds ?? (() => Math.floor(Date.now() / 1000));
  const stopping = new AbortController();
  const running = new Map<string, Promise<void>>();
  /** Wakes the poll loop early: set while every slot was taken by the last claim. */
  let wakeEarly: (() => void) | null = null;

  /** One attempt: decide the target, post, record. Answers the outcome recorded. */
  async function attempt(
    subscription: ClaimedWebhookSubscription,
    secret: string,
    event: OutboxEvent,
    attemptNo: number,
  ) {
    const started = performance.now();
    let statusCode: number | null = null;
    let error: WebhookFailureReason | null = null;
    const target = await decideWebhookTarget(subscription.url, allowHosts, resolve);
    if (!target.ok) {
      error = target.reason;
      // The detail is for the operator's log only; the tenant sees the closed reason.
      log.info(
        { webhookId: subscription.id, reason: target.reason, detail: target.detail },
        'webhook target refused',
      );
    } else {
      const body = JSON.stringify(event);
      const timestamp = nowSeconds();
      const answer = await postWebhook({
        url: target.url,
        address: target.address,
        headers: {
          'content-type': 'application/json',
          'user-agent': 'better-compute-webhooks/1',
          [signatureHeaders.id]: event.id,
          [signatureHeaders.timestamp]: String(timestamp),
          [signatureHeaders.signature]: signWebhook(secret, event.id, timestamp, body),
          'x-better-compute-event': event.type,
        },
        body,
        timeoutMs,
        signal: stopping.signal,
      });
      if (answer.answered) {
        statusCode = answer.statusCode;
        if (statusCode < 200 || statusCode >= 300) error = 'http-error';
      } else {
        error = answer.reason;
      }
    }
    const outcome = error === null ? 'succeeded' : attemptNo >= maxAttempts ? 'failed' : 'retrying';
    const durationMs = Math.round(performance.now() - started);
    await db.transaction().execute(async (trx) => {
      await insertWebhookDelivery(trx, {
        id: newId('hook'),
        subscriptionId: subscription.id,
        eventId: event.id,
        eventSeq: event.seq,
        eventType: event.type,
        attempt: attemptNo,
        outcome,
        statusCode,
        error,
        durationMs,
      });
      if (outcome === 'retrying') {
        await scheduleWebhookRetry(trx, {
          subscriptionId: subscription.id,
          owner,
          attempts: attemptNo,
          delayMs: backoffMs(attemptNo),
        });
      }
    });
    const fields = { webhookId: subscription.id, eventId: event.id, outcome, attempt: attemptNo, error };
    if (outcome === 'retrying') log.info(fields, 'webhook delivery failed');
    else log.debug(fields, 'webhook delivery');
    return outcome;
  }

  /**
   * Delivers what is due to one subscription up to `head`, in order, until it is caught up, must
   * wait for a retry, or had its turn (`maxEventsPerTurn`).
   */
  async function drain(subscription: ClaimedWebhookSubscription, head: OutboxCursor) {
    let cursor: OutboxCursor = { xid: subscription.cursor_xid, seq: Number(subscription.cursor_seq) };
    let attempts = subscription.attempts;
    let delivered = 0;
    const filter = { tenantId: subscription.tenant_id, types: subscription.event_types };
    let secret: string | null = null;
    while (!stopping.signal.aborted) {
      const page = await readOutbox(db, cursor, filter, 20, head);
      if (page.events.length === 0) {
        // Nothing up to the head is of interest: move there, so later passes never scan it again.
        if (compareCursors(head, cursor) > 0) await skipWebhookCursorTo(db, subscription.id, owner, head);
        return;
      }
      // Opened only when there is something to sign; a secret that does not open (another
      // deployment secret) fails this turn with the reason logged, and nothing is recorded.
      secret ??= await openWebhookSecret(db, sealer, subscription);
      for (const event of page.events) {
        if (stopping.signal.aborted) return;
        const outcome = await attempt(subscription, secret, event, attempts + 1);
        if (outcome === 'retrying') return;
        attempts = 0;
        const next = await advanceWebhookCursor(db, subscription.id, owner, event.seq);
        if (!next) return; // the lease moved on, or the subscription was deleted
        cursor = next;
        if (++delivered >= maxEventsPerTurn) return;
      }
    }
  }

  /** One poll: at most three statements, whatever the number of subscriptions. */
  async function tick() {
    const head = await outboxHead(db);
    const working = [...running.keys()];
    await renewWebhookLeases(db, owner, working, leaseMs);
    const free = maxConcurrent - running.size;
    if (free <= 0) return;
    const claimed = await claimDueWebhookSubscriptions(db, {
      owner,
      leaseMs,
      limit: free,
      behind: head,
      exclude: working,
    });
    // Every slot taken: more may be due, so the next poll comes as soon as one slot frees.
    const saturated = claimed.length === free;
    for (const subscription of claimed) {
      const work = drain(subscription, head)
        .catch((err: unknown) => {
          if (!outage.failed(err, 'delivery')) {
            log.error({ err, webhookId: subscription.id }, 'webhook dispatch failed');
          }
        })
        .finally(() => {
          running.delete(subscription.id);
          if (saturated) wakeEarly?.();
        });
      running.set(subscription.id, work);
    }
  }

  const loop = (async () => {
    try {
      const sealed = await sealPlaintextWebhookSecrets(db, sealer);
      if (sealed > 0) log.info({ sealed }, 'webhook secrets stored in plaintext were sealed');
    } catch (err) {
      // Not fatal: a claimed subscription's secret is sealed when it is opened (openWebhookSecret).
      if (!outage.failed(err, 'sealing'))
        log.error({ err }, 'sealing webhook secrets stored in plaintext failed');
    }
    while (!stopping.signal.aborted) {
      // Every tick reads the outbox head first: one that returns proves the database answers.
      await tick().then(
        () => outage.reachable('database'),
        (err: unknown) => {
          if (!outage.failed(err, 'poll')) log.error({ err }, 'webhook dispatcher tick failed');
        },
      );
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          stopping.signal.removeEventListener('abort', done);
          wakeEarly = null;
          resolve();
        };
        const timer = setTimeout(done, pollMs);
        wakeEarly = done;
        stopping.signal.addEventListener('abort', done, { once: true });
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
      await releaseWebhookLeases(db, owner).catch(() => {});
    },
  };
}

export type WebhookDispatcher = ReturnType<typeof startWebhookDispatcher>;
