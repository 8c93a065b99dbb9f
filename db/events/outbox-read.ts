import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';

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

/** The SQL twin of `typeMatches` (events/outbox.ts). */
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
 * horizon of transactions still in flight (nor past `until`). Returns the events, their positions
 * and the cursor after the last one (`cursor` itself when there is none).
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
    WHERE xid < outbox_horizon()
      AND (xid, seq) > (${cursor.xid}::xid8, ${cursor.seq}::bigint)
      AND (${filter.tenantId}::text IS NULL OR tenant_id = ${filter.tenantId})
      AND (${filter.subject ?? null}::text IS NULL OR subject = ${filter.subject ?? null})
      AND ${typeCondition(filter.types)}
      AND ${until ? sql`(xid, seq) <= (${until.xid}::xid8, ${until.seq}::bigint)` : sql`true`}
    ORDER BY outbox_events.xid, seq
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
    WHERE xid < outbox_horizon()
    ORDER BY outbox_events.xid DESC, seq DESC LIMIT 1`.execute(db);
  const row = rows[0];
  return row ? { xid: row.xid, seq: Number(row.seq) } : outboxStart;
}

/**
 * Where a resume point stands: the newest seq written, and whether the first event after `afterSeq`
 * (if any) is older than `maxAgeHours` by `compute_now()`. Two index probes.
 */
export async function replayPosition(
  db: Db,
  afterSeq: number,
  maxAgeHours: number,
): Promise<{ newestSeq: number; firstAfterTooOld: boolean }> {
  const { rows } = await sql<{ newest: string | null; too_old: boolean | null }>`
    SELECT (SELECT max(seq) FROM outbox_events) AS newest,
      (SELECT created_at < compute_now() - make_interval(secs => ${maxAgeHours * 3600})
       FROM outbox_events WHERE seq > ${afterSeq} ORDER BY seq LIMIT 1) AS too_old`.execute(db);
  return { newestSeq: Number(rows[0]?.newest ?? 0), firstAfterTooOld: rows[0]?.too_old === true };
}

/**
 * The seq of the oldest event not older than `maxAgeHours` by `compute_now()`, or null when there
 * is none. Found by a binary search over seq (creation times grow with seq, give or take a
 * transaction's length), so it costs a few dozen index probes at most, never a scan of history.
 */
export async function oldestSeqWithinAge(db: Db, maxAgeHours: number): Promise<number | null> {
  const ageSeconds = maxAgeHours * 3600;
  /** The first event at or after `seq`: its seq and whether it is too old; null past the end. */
  const probe = async (seq: number) => {
    const { rows } = await sql<{ seq: string; too_old: boolean }>`
      SELECT seq, created_at < compute_now() - make_interval(secs => ${ageSeconds}) AS too_old
      FROM outbox_events WHERE seq >= ${seq} ORDER BY seq LIMIT 1`.execute(db);
    return rows[0] ? { seq: Number(rows[0].seq), tooOld: rows[0].too_old } : null;
  };
  const first = await probe(0);
  if (!first?.tooOld) return first?.seq ?? null;
  const { rows } = await sql<{ newest: string }>`SELECT max(seq) AS newest FROM outbox_events`.execute(db);
  // Invariant: the event at or after `lo` is too old; the first one within the age is after `lo`.
  let lo = first.seq;
  let hi = Number(rows[0]!.newest) + 1;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    const at = await probe(mid);
    if (!at?.tooOld) hi = mid;
    else lo = at.seq;
  }
  const found = await probe(hi);
  return found && !found.tooOld ? found.seq : null;
}
