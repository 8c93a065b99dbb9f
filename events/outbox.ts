import { sql } from 'kysely';
import type { Db } from '../core/database.ts';

/** One outbox event as every door shows it (events.list, the stream, webhooks). */
export interface OutboxEvent {
  id: string;
  seq: number;
  type: string;
  subject: string;
  tenantId: string | null;
  data: Record<string, unknown>;
  /** Epoch milliseconds. */
  createdAt: number;
}

/**
 * A position in the outbox: the writing transaction's id and the seq. Events are read in
 * (xid, seq) order and only once their transaction is older than every transaction in flight, so
 * that order only ever grows at its end and a cursor never skips an event that committed late.
 */
export interface OutboxCursor {
  xid: string;
  seq: number;
}

export const outboxStart: OutboxCursor = { xid: '0', seq: 0 };

export interface OutboxFilter {
  /** null: every tenant (and events that belong to none). */
  tenantId: string | null;
  subject?: string | undefined;
  /** Exact types, or `prefix.*` patterns; empty or absent: every type. */
  types?: readonly string[] | undefined;
}

interface Row {
  seq: string;
  id: string;
  type: string;
  subject: string;
  tenant_id: string | null;
  data: Record<string, unknown>;
  created_at: Date;
  xid: string;
}

function toEvent(row: Row): OutboxEvent {
  return {
    id: row.id,
    seq: Number(row.seq),
    type: row.type,
    subject: row.subject,
    tenantId: row.tenant_id,
    data: row.data,
    createdAt: row.created_at.getTime(),
  };
}

function typeCondition(types: readonly string[] | undefined) {
  if (!types?.length) return sql`true`;
  const exact = types.filter((t) => !t.endsWith('*'));
  const prefixes = types
    .filter((t) => t.endsWith('*'))
    .map((t) => `${t.slice(0, -1).replace(/[\\%_]/g, '\\$&')}%`);
  return sql`(type = ANY(${exact}::text[]) OR type LIKE ANY(${prefixes}::text[]))`;
}

/**
 * Up to `limit` events after `cursor` that match `filter`, in (xid, seq) order, never past the
 * horizon of transactions still in flight. Returns the events and the cursor after the last one.
 */
export async function readOutbox(
  db: Db,
  cursor: OutboxCursor,
  filter: OutboxFilter,
  limit: number,
  until?: OutboxCursor,
): Promise<{ events: OutboxEvent[]; positions: OutboxCursor[]; cursor: OutboxCursor }> {
  const { rows } = await sql<Row>`
    SELECT seq, id, type, subject, tenant_id, data, created_at, xid::text AS xid
    FROM outbox_events
    WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
      AND (xid, seq) > (${cursor.xid}::xid8, ${cursor.seq}::bigint)
      AND (${filter.tenantId}::text IS NULL OR tenant_id = ${filter.tenantId})
      AND (${filter.subject ?? null}::text IS NULL OR subject = ${filter.subject ?? null})
      AND ${typeCondition(filter.types)}
      AND ${until ? sql`(xid, seq) <= (${until.xid}::xid8, ${until.seq}::bigint)` : sql`true`}
    ORDER BY xid, seq
    LIMIT ${limit}`.execute(db);
  const last = rows.at(-1);
  return {
    events: rows.map(toEvent),
    positions: rows.map((r) => ({ xid: r.xid, seq: Number(r.seq) })),
    cursor: last ? { xid: last.xid, seq: Number(last.seq) } : cursor,
  };
}

/** The cursor just after the event with this seq (the stream's `Last-Event-ID`); 0 is the start. */
export async function cursorAfterSeq(db: Db, seq: number): Promise<OutboxCursor> {
  if (seq <= 0) return outboxStart;
  const { rows } = await sql<{ xid: string; seq: string }>`
    SELECT xid::text AS xid, seq FROM outbox_events WHERE seq <= ${seq} ORDER BY seq DESC LIMIT 1`.execute(
    db,
  );
  const row = rows[0];
  return row ? { xid: row.xid, seq: Number(row.seq) } : outboxStart;
}

/**
 * The cursor at the outbox's current end: everything readable now is behind it. A reader that
 * starts here sees only what commits from now on (and what was still in flight).
 */
export async function outboxHead(db: Db): Promise<OutboxCursor> {
  const { rows } = await sql<{ xid: string; seq: string }>`
    SELECT xid::text AS xid, seq FROM outbox_events
    WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY xid DESC, seq DESC LIMIT 1`.execute(db);
  const row = rows[0];
  return row ? { xid: row.xid, seq: Number(row.seq) } : outboxStart;
}

/** Whether an event type matches a list of exact types or `prefix.*` patterns (empty: all). */
export function typeMatches(patterns: readonly string[], type: string): boolean {
  if (patterns.length === 0) return true;
  return patterns.some((p) => (p.endsWith('*') ? type.startsWith(p.slice(0, -1)) : p === type));
}

/** Orders two outbox positions: negative, zero or positive. */
export function compareCursors(a: OutboxCursor, b: OutboxCursor): number {
  const ax = BigInt(a.xid);
  const bx = BigInt(b.xid);
  if (ax !== bx) return ax < bx ? -1 : 1;
  return a.seq - b.seq;
}

/** Whether an event passes a filter (the in-memory twin of readOutbox's WHERE clause). */
export function eventMatches(event: OutboxEvent, filter: OutboxFilter): boolean {
  if (filter.tenantId !== null && event.tenantId !== filter.tenantId) return false;
  if (filter.subject !== undefined && event.subject !== filter.subject) return false;
  return typeMatches(filter.types ?? [], event.type);
}
