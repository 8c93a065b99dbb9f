import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { isSealed, type Sealed, type Sealer } from '../../domain/sealing.ts';
import {
  storedFailureReason,
  type WebhookDeliveryOutcome,
  type WebhookFailureReason,
} from '../../domain/webhook-target.ts';
import type { OutboxCursor } from './outbox-read.ts';

type Trx = Transaction<Database>;

/** A tenant's webhook subscription, without its secret or its delivery state. */
export interface WebhookSubscriptionInfo {
  id: string;
  tenantId: string;
  url: string;
  eventTypes: string[];
  description: string;
  createdAt: Date;
}

/** A subscription as the dispatcher works it: where it stands and how often its event failed. */
export interface ClaimedWebhookSubscription {
  id: string;
  tenant_id: string;
  url: string;
  /** The signing secret as stored: sealed (or plaintext from before sealing); see openWebhookSecret. */
  stored_secret: string;
  event_types: string[];
  cursor_xid: string;
  cursor_seq: string;
  attempts: number;
}

export interface WebhookDelivery {
  id: string;
  eventId: string;
  eventSeq: number;
  eventType: string;
  attempt: number;
  outcome: WebhookDeliveryOutcome;
  /** Only from a target that passed the checks (never for a refused one). */
  statusCode: number | null;
  error: WebhookFailureReason | null;
  durationMs: number;
  createdAt: Date;
}

// Two-key advisory locks in this space serialize the webhook writes of one tenant.
const webhookTenantLockSpace = 0x6263_0017;

/**
 * Inserts a subscription that delivers the events after `cursor` (the outbox's head: from now on),
 * unless the tenant already has `maxPerTenant` live ones: then nothing is written and the answer is
 * `{ subscription: null, live }`. The count and the insert are serialized per tenant (an advisory
 * lock in the caller's transaction), so concurrent creates never pass the cap together.
 */
export async function insertWebhookSubscriptionWithinCap(
  trx: Trx,
  subscription: {
    id: string;
    tenantId: string;
    url: string;
    /** The signing secret, sealed: the table never holds it in plaintext. */
    secret: Sealed<'webhook-secret'>;
    eventTypes: string[];
    description: string;
    createdBy: string;
    cursor: OutboxCursor;
  },
  maxPerTenant: number,
): Promise<{ subscription: WebhookSubscriptionInfo | null; live: number }> {
  await sql`SELECT pg_advisory_xact_lock(${webhookTenantLockSpace}, hashtext(${subscription.tenantId}))`.execute(
    trx,
  );
  const { live } = await trx
    .selectFrom('webhook_subscriptions')
    .select((eb) => eb.fn.countAll<string>().as('live'))
    .where('tenant_id', '=', subscription.tenantId)
    .where('deleted_at', 'is', null)
    .executeTakeFirstOrThrow();
  if (Number(live) >= maxPerTenant) return { subscription: null, live: Number(live) };
  const row = await trx
    .insertInto('webhook_subscriptions')
    .values({
      id: subscription.id,
      tenant_id: subscription.tenantId,
      url: subscription.url,
      secret: subscription.secret,
      event_types: subscription.eventTypes,
      description: subscription.description,
      created_by: subscription.createdBy,
      cursor_xid: subscription.cursor.xid,
      cursor_seq: subscription.cursor.seq,
    })
    .returning(['id', 'tenant_id', 'url', 'event_types', 'description', 'created_at'])
    .executeTakeFirstOrThrow();
  return { subscription: toInfo(row), live: Number(live) + 1 };
}

function toInfo(row: {
  id: string;
  tenant_id: string;
  url: string;
  event_types: string[];
  description: string;
  created_at: Date;
}): WebhookSubscriptionInfo {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    url: row.url,
    eventTypes: row.event_types,
    description: row.description,
    createdAt: row.created_at,
  };
}

/** The tenant's subscriptions that are not deleted, oldest first. */
export async function listWebhookSubscriptions(db: Db, tenantId: string): Promise<WebhookSubscriptionInfo[]> {
  const rows = await db
    .selectFrom('webhook_subscriptions')
    .select(['id', 'tenant_id', 'url', 'event_types', 'description', 'created_at'])
    .where('tenant_id', '=', tenantId)
    .where('deleted_at', 'is', null)
    .orderBy('created_at')
    .execute();
  return rows.map(toInfo);
}

/**
 * Marks a subscription deleted at `compute_now()` and drops its lease, so no dispatcher works it
 * again. False when the tenant has no such subscription (or it is already deleted).
 */
export async function deleteWebhookSubscription(
  db: Db,
  tenantId: string,
  webhookId: string,
): Promise<boolean> {
  const row = await db
    .updateTable('webhook_subscriptions')
    .set({ deleted_at: sql<Date>`compute_now()`, lease_owner: null, lease_until: null })
    .where('id', '=', webhookId)
    .where('tenant_id', '=', tenantId)
    .where('deleted_at', 'is', null)
    .returning('id')
    .executeTakeFirst();
  return row !== undefined;
}

/** Whether the tenant has (or had: deleted ones count) this subscription. */
export async function webhookSubscriptionExists(
  db: Db,
  tenantId: string,
  webhookId: string,
): Promise<boolean> {
  const row = await db
    .selectFrom('webhook_subscriptions')
    .select('id')
    .where('id', '=', webhookId)
    .where('tenant_id', '=', tenantId)
    .executeTakeFirst();
  return row !== undefined;
}

/**
 * A subscription's delivery attempts, newest first, each failure as a closed reason (rows written
 * before the reasons were closed read as the nearest one, without their status code).
 */
export async function listWebhookDeliveries(
  db: Db,
  subscriptionId: string,
  limit: number,
): Promise<WebhookDelivery[]> {
  const rows = await db
    .selectFrom('webhook_deliveries')
    .selectAll()
    .where('subscription_id', '=', subscriptionId)
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .limit(limit)
    .execute();
  return rows.map((r) => {
    const { reason, legacy } = storedFailureReason(r.error);
    return {
      id: r.id,
      eventId: r.event_id,
      eventSeq: Number(r.event_seq),
      eventType: r.event_type,
      attempt: r.attempt,
      outcome: r.outcome,
      statusCode: legacy ? null : r.status_code,
      error: reason,
      durationMs: r.duration_ms,
      createdAt: r.created_at,
    };
  });
}

/**
 * Claims, for `leaseMs` from `compute_now()`, at most `limit` live subscriptions that stand behind
 * `behind` (the outbox's head: there may be something to deliver), are not leased by another
 * dispatcher (nor row-locked by one claiming right now: SKIP LOCKED), are not in `exclude` (the
 * ones this dispatcher is working) and whose retry, if any, is due; furthest behind first. One
 * statement whatever the number of subscriptions, answering at most `limit` rows.
 */
export async function claimDueWebhookSubscriptions(
  db: Db,
  claim: { owner: string; leaseMs: number; limit: number; behind: OutboxCursor; exclude: readonly string[] },
): Promise<ClaimedWebhookSubscription[]> {
  if (claim.limit <= 0) return [];
  const { rows } = await sql<ClaimedWebhookSubscription>`
    UPDATE webhook_subscriptions AS s
    SET lease_owner = ${claim.owner},
        lease_until = compute_now() + make_interval(secs => ${claim.leaseMs / 1000})
    FROM (
      SELECT id FROM webhook_subscriptions
      WHERE deleted_at IS NULL
        AND (lease_until IS NULL OR lease_until < compute_now() OR lease_owner = ${claim.owner})
        AND (next_attempt_at IS NULL OR next_attempt_at <= compute_now())
        AND (cursor_xid, cursor_seq) < (${claim.behind.xid}::xid8, ${claim.behind.seq}::bigint)
        AND NOT (id = ANY(${[...claim.exclude]}::text[]))
      ORDER BY cursor_xid, cursor_seq, id
      LIMIT ${claim.limit}
      FOR UPDATE SKIP LOCKED
    ) AS due
    WHERE s.id = due.id
    RETURNING s.id, s.tenant_id, s.url, s.secret AS stored_secret, s.event_types, s.cursor_xid::text AS cursor_xid,
      s.cursor_seq, s.attempts`.execute(db);
  return rows;
}

/**
 * Opens a claimed subscription's signing secret. One stored in plaintext (written before secrets
 * were sealed, or by an older process during an upgrade) is sealed in place first, once: the write
 * is conditional on the stored value, so two dispatchers racing leave one sealed value.
 *
 * Throws SealedValueError (domain/sealing.ts) when the secret does not open with this deployment
 * secret (BETTER_COMPUTE_SECRET changed).
 */
export async function openWebhookSecret(
  db: Db,
  sealer: Sealer,
  subscription: Pick<ClaimedWebhookSubscription, 'id' | 'stored_secret'>,
): Promise<string> {
  const stored = subscription.stored_secret;
  if (isSealed(stored)) return sealer.open('webhook-secret', stored);
  await db
    .updateTable('webhook_subscriptions')
    .set({ secret: sealer.seal('webhook-secret', stored) })
    .where('id', '=', subscription.id)
    .where('secret', '=', stored)
    .execute();
  return stored;
}

/**
 * Seals every signing secret still stored in plaintext (subscriptions created before secrets were
 * sealed, deleted ones included), `batchSize` rows per transaction; answers how many it sealed.
 * Idempotent, and safe beside other dispatchers doing the same (rows another one holds are skipped
 * and sealed by it). Rows whose stored value is sealed are never touched.
 */
export async function sealPlaintextWebhookSecrets(db: Db, sealer: Sealer, batchSize = 500): Promise<number> {
  let sealed = 0;
  for (;;) {
    const count = await db.transaction().execute(async (trx) => {
      const { rows } = await sql<{ id: string; secret: string }>`
        SELECT id, secret FROM webhook_subscriptions
        WHERE secret NOT LIKE 'sealed:%'
        LIMIT ${batchSize}
        FOR UPDATE SKIP LOCKED`.execute(trx);
      if (rows.length === 0) return 0;
      const secrets: Sealed<'webhook-secret'>[] = rows.map((r) => sealer.seal('webhook-secret', r.secret));
      await sql`
        UPDATE webhook_subscriptions AS s SET secret = v.secret
        FROM unnest(${rows.map((r) => r.id)}::text[], ${secrets}::text[]) AS v(id, secret)
        WHERE s.id = v.id`.execute(trx);
      return rows.length;
    });
    sealed += count;
    if (count < batchSize) return sealed;
  }
}

/** Extends, to `leaseMs` from `compute_now()`, the leases `owner` still holds on these subscriptions. */
export async function renewWebhookLeases(
  db: Db,
  owner: string,
  subscriptionIds: readonly string[],
  leaseMs: number,
): Promise<void> {
  if (subscriptionIds.length === 0) return;
  await sql`
    UPDATE webhook_subscriptions
    SET lease_until = compute_now() + make_interval(secs => ${leaseMs / 1000})
    WHERE id = ANY(${[...subscriptionIds]}::text[]) AND lease_owner = ${owner} AND deleted_at IS NULL`.execute(
    db,
  );
}

/** Records one delivery attempt, in the caller's transaction. */
export async function insertWebhookDelivery(
  trx: Trx,
  delivery: Omit<WebhookDelivery, 'createdAt'> & { subscriptionId: string },
): Promise<void> {
  await trx
    .insertInto('webhook_deliveries')
    .values({
      id: delivery.id,
      subscription_id: delivery.subscriptionId,
      event_id: delivery.eventId,
      event_seq: delivery.eventSeq,
      event_type: delivery.eventType,
      attempt: delivery.attempt,
      outcome: delivery.outcome,
      status_code: delivery.statusCode,
      error: delivery.error,
      duration_ms: delivery.durationMs,
    })
    .execute();
}

/**
 * Holds a subscription's current event for a retry `delayMs` after `compute_now()`, counting
 * `attempts` failures so far; only while `owner` holds its lease.
 */
export async function scheduleWebhookRetry(
  trx: Trx,
  retry: { subscriptionId: string; owner: string; attempts: number; delayMs: number },
): Promise<void> {
  await sql`
    UPDATE webhook_subscriptions
    SET attempts = ${retry.attempts},
        next_attempt_at = compute_now() + make_interval(secs => ${retry.delayMs / 1000}),
        updated_at = compute_now()
    WHERE id = ${retry.subscriptionId} AND lease_owner = ${retry.owner}`.execute(trx);
}

/**
 * Moves a subscription's cursor forward to `head` when nothing before it was of interest; only
 * while `owner` holds its lease and no event of it is failing, and never backwards.
 */
export async function skipWebhookCursorTo(
  db: Db,
  subscriptionId: string,
  owner: string,
  head: OutboxCursor,
): Promise<void> {
  await sql`
    UPDATE webhook_subscriptions SET cursor_xid = ${head.xid}::xid8, cursor_seq = ${head.seq}
    WHERE id = ${subscriptionId} AND lease_owner = ${owner} AND attempts = 0
      AND (cursor_xid, cursor_seq) < (${head.xid}::xid8, ${head.seq}::bigint)`.execute(db);
}

/**
 * Moves a subscription's cursor past the delivered event `seq` and clears its failures; only while
 * `owner` holds its lease. Answers the new cursor, or null when the lease moved on or the
 * subscription was deleted.
 */
export async function advanceWebhookCursor(
  db: Db,
  subscriptionId: string,
  owner: string,
  seq: number,
): Promise<OutboxCursor | null> {
  const { rows } = await sql<{ xid: string }>`
    UPDATE webhook_subscriptions AS s
    SET cursor_xid = o.xid, cursor_seq = o.seq, attempts = 0, next_attempt_at = NULL,
        updated_at = compute_now()
    FROM outbox_events AS o
    WHERE s.id = ${subscriptionId} AND s.lease_owner = ${owner} AND o.seq = ${seq}
    RETURNING o.xid::text AS xid`.execute(db);
  return rows[0] ? { xid: rows[0].xid, seq } : null;
}

/** Drops every lease `owner` holds (a dispatcher stopping), so another one takes over at once. */
export async function releaseWebhookLeases(db: Db, owner: string): Promise<void> {
  await sql`UPDATE webhook_subscriptions SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = ${owner}`.execute(
    db,
  );
}
