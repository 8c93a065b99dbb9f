import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';
import { notifyPoolQueuedAfterCommit } from '../notify-channels.ts';
import { preparedMarker } from '../pool.ts';
import { loaderPerDb, togetherOrEachAlone } from '../soon-loader.ts';
import { type AtOnceInput, admissionWrites, queueDraftAtOnce } from './place-draft-at-once.ts';
import { type QueuedOutcome, queuedCondition, queuedEvent } from './placement.ts';

type QueueInput = AtOnceInput & { onNotifyError: (error: unknown) => void };

/** One draft to queue, with what its decision writes (admissionWrites'). */
interface Queued {
  input: QueueInput;
  writes: NonNullable<ReturnType<typeof admissionWrites>>;
}

/**
 * Several fresh drafts queued for the pool-lease placer in one statement, all or nothing: each
 * draft made `pending` with its `Queued`/`PoolPlacer` condition only if it is still the draft of
 * its version, with its event, its audit row and its quota charge; the quota rows locked in one
 * order (tenant, pool, resource) before any is changed, and each charged the sum of its drafts only
 * within its limit. When any guard finds nothing to change or no room, the whole statement fails
 * (BC002) and nothing of it stays. Answers each draft's new version.
 */
async function queueDraftsTogether(db: Db, drafts: readonly Queued[]): Promise<Map<string, number>> {
  const input = drafts.map(({ input: { row, now, audit: caller }, writes }) => {
    const event = queuedEvent(row);
    const audit = { ...writes.audit, context: { ...writes.audit.context, outcome: 'queued' } };
    return {
      id: row.id,
      version: row.version,
      tenant_id: row.tenant_id,
      pool_id: row.pool_id,
      resource: writes.charge.resource,
      amount: writes.charge.amount,
      admission_context: caller.context,
      conditions: [{ ...queuedCondition, since: now }],
      event_id: newId('evt'),
      event_type: event.type,
      event_subject: event.subject,
      event_data: event.data,
      actor_identity_id: audit.actorIdentityId,
      action: audit.action,
      request_id: audit.requestId,
      audit_context: audit.context,
    };
  });
  const { rows } = await sql<{
    versions: Array<{ id: string; version: number }> | null;
  }>`${sql.raw(preparedMarker)}
    WITH input AS (
      SELECT * FROM jsonb_to_recordset(${JSON.stringify(input)}::jsonb) AS i(
        id text, version integer, tenant_id text, pool_id text, resource text, amount numeric,
        admission_context jsonb, conditions jsonb, event_id text, event_type text, event_subject text,
        event_data jsonb, actor_identity_id text, action text, request_id text, audit_context jsonb)
    ), u AS (
      UPDATE reservations r
      SET admission_context = i.admission_context, confirmation_id = NULL, state = 'pending',
          conditions = i.conditions, pending_since = COALESCE(r.pending_since, compute_now()),
          version = r.version + 1, updated_at = compute_now()
      FROM input i
      WHERE r.id = i.id AND r.state = 'draft' AND r.version = i.version
      RETURNING r.id, r.version
    ), o AS (
      INSERT INTO outbox_events (id, type, subject, tenant_id, data)
      SELECT i.event_id, i.event_type, i.event_subject, i.tenant_id, i.event_data
      FROM input i JOIN u ON u.id = i.id
    ), a AS (
      INSERT INTO audit_events (tenant_id, actor_identity_id, action, resource_type, resource_id, outcome, request_id, context)
      SELECT i.tenant_id, i.actor_identity_id, i.action, 'compute-reservation', i.id, 'allowed', i.request_id,
             i.audit_context
      FROM input i JOIN u ON u.id = i.id
    ), need AS (
      SELECT i.tenant_id, i.pool_id, i.resource, sum(i.amount) AS amount
      FROM input i JOIN u ON u.id = i.id
      WHERE NOT EXISTS (SELECT 1 FROM quota_charges c
                        WHERE c.reservation_id = i.id AND c.resource = i.resource AND c.refunded_at IS NULL)
      GROUP BY i.tenant_id, i.pool_id, i.resource
    ), locked AS (
      SELECT q.tenant_id, q.pool_id, q.resource FROM quotas q
      WHERE (q.tenant_id, q.pool_id, q.resource) IN (SELECT tenant_id, pool_id, resource FROM need)
      ORDER BY q.tenant_id, q.pool_id, q.resource
      FOR UPDATE
    ), up AS (
      UPDATE quotas q SET used = q.used + n.amount
      FROM need n JOIN locked l USING (tenant_id, pool_id, resource)
      WHERE q.tenant_id = n.tenant_id AND q.pool_id = n.pool_id AND q.resource = n.resource
        AND q.used + n.amount <= q.limit_amount
      RETURNING q.tenant_id, q.pool_id, q.resource
    ), charge AS (
      INSERT INTO quota_charges (reservation_id, tenant_id, pool_id, resource, amount)
      SELECT i.id, i.tenant_id, i.pool_id, i.resource, i.amount
      FROM input i JOIN up USING (tenant_id, pool_id, resource)
      WHERE EXISTS (SELECT 1 FROM u WHERE u.id = i.id)
        AND NOT EXISTS (SELECT 1 FROM quota_charges c
                        WHERE c.reservation_id = i.id AND c.resource = i.resource AND c.refunded_at IS NULL)
      ON CONFLICT (reservation_id, resource) DO UPDATE
        SET amount = EXCLUDED.amount, refunded_at = NULL, charged_at = compute_now()
      RETURNING 1
    )
    SELECT (SELECT json_agg(json_build_object('id', u.id, 'version', u.version)) FROM u) AS versions,
           CASE WHEN (SELECT count(*) FROM u) <> (SELECT count(*) FROM input)
                  OR (SELECT count(*) FROM up) <> (SELECT count(*) FROM need)
                THEN compute_abort(${'a draft changed, or a quota ran out, while several were queued together'}) END AS aborted`.execute(
    db,
  );
  return new Map((rows[0]?.versions ?? []).map((v) => [v.id, v.version]));
}

/**
 * queueDraftsTogether for the drafts gathered, then the placer of each of their pools notified
 * once they committed. Answers each draft's outcome.
 */
async function queueGathered(db: Db, drafts: readonly Queued[]): Promise<Array<QueuedOutcome | null>> {
  if (new Set(drafts.map((d) => d.input.row.id)).size !== drafts.length) {
    throw new Error('one draft twice among those queued together');
  }
  const versions = await queueDraftsTogether(db, drafts);
  const pools = new Map(drafts.map((d) => [d.input.row.pool_id, d.input.onNotifyError]));
  // After the commit, not in it (see notifyPoolQueuedAfterCommit).
  for (const [poolId, onError] of pools) notifyPoolQueuedAfterCommit(db, poolId, onError);
  return drafts.map(({ input }) => {
    const version = versions.get(input.row.id);
    return version === undefined ? null : { outcome: 'queued' as const, version };
  });
}

/** The loader that gathers concurrent queue decisions (queueDraftSoon). */
const queueLoader = loaderPerDb(
  // When the shared statement fails (a guard, or anything else), each draft is decided again by
  // queueDraftAtOnce on its own, which answers it as if it had come alone.
  (db, drafts: readonly Queued[]) =>
    togetherOrEachAlone(
      drafts,
      (all) => queueGathered(db, all),
      ({ input }) => queueDraftAtOnce(db, input),
    ),
  { maxBatchSize: 100 },
);

/**
 * queueDraftAtOnce for a caller among many deciding at the same moment (the creates a pool-lease
 * batch's commit answers come back together): every fresh draft queued before the event loop's
 * next turn is queued in one statement (queueDraftsTogether). Answers null, having written nothing,
 * when the common case does not apply or did not decide it; the caller then runs placeDraft.
 */
export function queueDraftSoon(db: Db, input: QueueInput): Promise<QueuedOutcome | null> {
  const writes = admissionWrites(input);
  if (!writes) return Promise.resolve(null);
  return queueLoader(db).load({ input, writes });
}
