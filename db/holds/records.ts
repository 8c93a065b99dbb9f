import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import type { EventType } from '../../domain/event-types.ts';
import type { HoldView } from '../../domain/holds.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import type { CallerAudit } from '../reservations/reservations.ts';

type Trx = Transaction<Database>;

/** The outbox events a hold writes, one per change of its state. */
export type HoldEventType = Extract<EventType, `hold.${string}`>;

/** The subject of a hold's events (`events list --subject hold/hold_…`). */
export const holdSubject = (holdId: string) => `hold/${holdId}`;

/** What every hold event carries: which hold, on which node, of which kind, held by whom. */
function holdEventData(hold: HoldView): Record<string, unknown> {
  return {
    holdId: hold.id,
    poolId: hold.poolId,
    nodeId: hold.nodeId,
    target: hold.target,
    kind: hold.kind,
    holder: hold.holder,
    cpuCores: hold.cpuCores,
    ramGiB: hold.ramGiB,
    vramGiB: hold.vramGiB,
    ttlSeconds: hold.ttlSeconds,
    onTrust: hold.onTrust,
    state: hold.state,
    endedAt: hold.endedAt,
  };
}

/**
 * Writes a hold's change in the caller's transaction (the one that made it): its outbox event
 * and, for a change a caller made (`audit`), its audit row naming who, which node and which kind.
 * Not idempotent by itself: the caller writes it only when the state changed. Codes: none.
 */
export async function recordHoldChange(
  trx: Trx,
  hold: HoldView,
  type: HoldEventType,
  audit?: CallerAudit,
): Promise<void> {
  await insertOutboxEvent(trx, {
    type,
    subject: holdSubject(hold.id),
    tenantId: hold.tenantId,
    data: holdEventData(hold),
  });
  if (!audit) return;
  await insertAuditEvent(trx, {
    tenantId: hold.tenantId,
    actorIdentityId: audit.actorIdentityId,
    action: audit.action,
    resourceType: 'compute-hold',
    resourceId: hold.id,
    requestId: audit.requestId,
    context: {
      ...audit.context,
      change: type,
      nodeId: hold.nodeId,
      target: hold.target,
      kind: hold.kind,
      holder: hold.holder,
    },
  });
}

/** The advisory lock space of holds' expiry announcements (key: hashtext of the hold id). */
const holdAnnouncementLockSpace = 0x6263_0018;

/**
 * The holds that lapsed (no heartbeat within their TTL, never released) whose `hold.expired` event
 * is not written yet, on `nodeId` when given, at most `limit`, locked (SKIP LOCKED: a concurrent
 * sweep takes others) until the caller's transaction ends; then each hold's announcement lock is
 * taken (a transaction advisory lock, in id order, waited for), and a statement after that (which
 * sees every event committed by a sweep that held it) keeps only those still without the event.
 * The row lock alone was seen to let two of three concurrent sweeps announce one hold under load
 * (CI, 2026-12-01); the announcement lock serializes them whatever let both through. Writes nothing.
 */
export async function lockUnannouncedExpiries(
  trx: Trx,
  input: { nodeId?: string | undefined; limit: number },
): Promise<string[]> {
  const { rows: locked } = await sql<{ id: string }>`
    SELECT h.id FROM host_holds h
    WHERE h.released_at IS NULL AND h.heartbeat_at + make_interval(secs => h.ttl_seconds) <= compute_now()
      AND ${input.nodeId ? sql`h.node_id = ${input.nodeId}` : sql`true`}
      AND NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.subject = 'hold/' || h.id AND o.type = 'hold.expired')
    ORDER BY h.heartbeat_at, h.id
    LIMIT ${input.limit}
    FOR UPDATE OF h SKIP LOCKED`.execute(trx);
  if (locked.length === 0) return [];
  const ids = locked.map((r) => r.id).sort();
  await sql`SELECT pg_advisory_xact_lock(${holdAnnouncementLockSpace}, hashtext(id))
            FROM unnest(${ids}::text[]) WITH ORDINALITY AS t(id, i) ORDER BY i`.execute(trx);
  const { rows } = await sql<{ id: string }>`
    SELECT id FROM unnest(${ids}::text[]) AS id
    WHERE NOT EXISTS (SELECT 1 FROM outbox_events o WHERE o.subject = 'hold/' || id AND o.type = 'hold.expired')`.execute(
    trx,
  );
  return rows.map((r) => r.id);
}
