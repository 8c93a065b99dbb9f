import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, inject, test } from 'vitest';
import {
  type OutboxCursor,
  type OutboxEvent,
  outboxHead,
  outboxStart,
  readOutbox,
} from '../../db/events/outbox-read.ts';
import { newId } from '../../domain/ids.ts';
import { compareCursors } from '../../events/outbox.ts';
import { createOutboxHub } from '../../events/outbox-hub.ts';
import { type TestDatabase, useTestDatabase } from '../support/database.ts';
import { insertOutboxEvent, untilReadable } from '../support/events.ts';
import { eventually } from '../support/eventually.ts';
import { testLogger } from '../support/logger.ts';

const database = useTestDatabase({ max: 6 });

const insertEvent = (db: TestDatabase['db'], type: string) =>
  insertOutboxEvent(db, { type, subject: 'reservation/rsv_x', tenantId: 'acme' });

/** A connection of its own, so a test can hold a transaction open between steps. */
async function session() {
  const client = await database.pool.connect();
  return {
    query: (text: string, values: unknown[] = []) => client.query(text, values),
    insert: (type: string) =>
      client.query(
        `INSERT INTO outbox_events (id, type, subject, tenant_id) VALUES ($1, $2, 'reservation/rsv_x', 'acme')`,
        [newId('evt'), type],
      ),
    release: () => client.release(),
  };
}

/**
 * Reads from `cursor` until `count` events arrived: what this proves is that they arrive, once and
 * in order, not when.
 */
async function readAtLeast(db: TestDatabase['db'], cursor: OutboxCursor, count: number) {
  const events: OutboxEvent[] = [];
  let at = cursor;
  const deadline = Date.now() + 30_000;
  while (events.length < count && Date.now() < deadline) {
    const page = await readOutbox(db, at, { tenantId: 'acme' }, 100);
    events.push(...page.events);
    at = page.cursor;
    if (events.length < count) await new Promise((r) => setTimeout(r, 20));
  }
  return { events, cursor: at };
}

describe('reading the outbox', () => {
  test('an event that draws a lower seq but commits later is neither lost nor repeated', async () => {
    const db = database.db;
    const head = await outboxHead(db);
    const b = await session();
    const a = await session();
    try {
      // B takes its transaction id first; A takes a later one and draws the lower seq.
      await b.query('BEGIN');
      await b.query('SELECT pg_current_xact_id()');
      await a.query('BEGIN');
      await a.insert('test.a');
      // B writes a higher seq and commits while A is still open.
      await b.insert('test.b');
      await b.query('COMMIT');
      await insertEvent(db, 'test.c');

      // A `seq > last` cursor would emit test.b and test.c now and skip test.a for ever. The reader
      // emits test.b (its transaction is older than every one in flight) and holds back test.c.
      const first = await readAtLeast(db, head, 1);
      expect(first.events.map((e) => e.type)).toEqual(['test.b']);

      await a.query('COMMIT');
      const second = await readAtLeast(db, first.cursor, 2);
      expect(second.events.map((e) => e.type)).toEqual(['test.a', 'test.c']);
      expect(second.events[0]!.seq).toBeLessThan(first.events[0]!.seq);
      const third = await readOutbox(db, second.cursor, { tenantId: 'acme' }, 100);
      expect(third.events).toEqual([]);
    } finally {
      a.release();
      b.release();
    }
  });

  test('a newer transaction that commits first waits behind an older open one', async () => {
    const db = database.db;
    const head = await outboxHead(db);
    const older = await session();
    try {
      await older.query('BEGIN');
      await older.insert('test.older');
      await insertEvent(db, 'test.newer');
      const whileOpen = await readOutbox(db, head, { tenantId: 'acme' }, 100);
      expect(whileOpen.events).toEqual([]);
      await older.query('ROLLBACK');
      const after = await readAtLeast(db, whileOpen.cursor, 1);
      expect(after.events.map((e) => e.type)).toEqual(['test.newer']);
    } finally {
      older.release();
    }
  });

  test('a transaction open in another database of the server holds nothing back', async () => {
    const db = database.db;
    const head = await outboxHead(db);
    const elsewhere = new pg.Client({ connectionString: inject('postgresAdminUrl') });
    await elsewhere.connect();
    try {
      // A long transaction in another database (a pg_dump, a report): older than the event below.
      await elsewhere.query('BEGIN');
      await elsewhere.query('SELECT pg_current_xact_id()');
      await insertOutboxEvent(db, {
        type: 'test.beside-elsewhere',
        subject: 'reservation/rsv_elsewhere',
        tenantId: 'acme',
      });
      const page = await readOutbox(db, head, { tenantId: 'acme' }, 100);
      expect(page.events.map((e) => e.type)).toEqual(['test.beside-elsewhere']);
      expect((await outboxHead(db)).seq).toBe(page.events[0]!.seq);
    } finally {
      await elsewhere.query('ROLLBACK').catch(() => {});
      await elsewhere.end();
    }
  });

  test('orders by transaction id as a number, also across a power of ten', async () => {
    const db = database.db;
    // Transaction ids 10 and 9, long committed: as text '10' sorts before '9'.
    const [ten, nine] = [newId('evt'), newId('evt')];
    for (const [id, xid] of [
      [ten, '10'],
      [nine, '9'],
    ] as const) {
      await db
        .insertInto('outbox_events')
        .values({
          id,
          type: 'test.digits',
          subject: 'reservation/rsv_digits',
          tenant_id: 'digits',
          data: '{}',
        })
        .execute();
      await sql`UPDATE outbox_events SET xid = ${xid}::xid8 WHERE id = ${id}`.execute(db);
    }
    const page = await readOutbox(db, outboxStart, { tenantId: 'digits' }, 100);
    expect(page.events.map((e) => e.id)).toEqual([nine, ten]);
    const { rows } = await sql<{ xid: string; seq: string }>`
      SELECT xid::text AS xid, seq FROM outbox_events WHERE xid < outbox_horizon()`.execute(db);
    const newest = rows
      .map((r) => ({ xid: r.xid, seq: Number(r.seq) }))
      .sort((a, b) => compareCursors(b, a))[0]!;
    expect(await outboxHead(db)).toEqual(newest);
  });

  test('filters by subject, type pattern and tenant', async () => {
    const db = database.db;
    const ids = [newId('evt'), newId('evt')];
    await db
      .insertInto('outbox_events')
      .values([
        { id: ids[0]!, type: 'node.cordoned', subject: 'node/node_1', tenant_id: null, data: '{}' },
        {
          id: ids[1]!,
          type: 'reservation.active',
          subject: 'reservation/rsv_y',
          tenant_id: 'globex',
          data: '{}',
        },
      ])
      .execute();
    await untilReadable(db, ids);
    const all = await readOutbox(db, outboxStart, { tenantId: null, types: ['node.*'] }, 100);
    expect(all.events.map((e) => e.type)).toEqual(['node.cordoned']);
    const globex = await readOutbox(db, outboxStart, { tenantId: 'globex' }, 100);
    expect(globex.events.map((e) => e.subject)).toEqual(['reservation/rsv_y']);
    await expect
      .poll(
        async () =>
          (
            await readOutbox(db, outboxStart, { tenantId: 'acme', subject: 'reservation/rsv_x' }, 100)
          ).events.map((e) => e.type),
        { timeout: 30_000 },
      )
      .toEqual(['test.b', 'test.a', 'test.c', 'test.newer']);
  });

  test('the shared tail: a follower that falls too far behind reads on its own, losing and repeating nothing', async () => {
    const db = database.db;
    const hub = createOutboxHub({ db, log: testLogger() }, { pollMs: 20, maxQueue: 5 });
    const controller = new AbortController();
    const subject = `reservation/${newId('rsv')}`;
    const follower = hub.follow(
      await outboxHead(db),
      { tenantId: 'acme', subject },
      controller.signal,
      60_000,
    );
    // The first pull joins the hub's tail and waits for an event.
    const first = follower.next();
    await eventually(async () => hub.liveFollowers() === 1);
    const written: string[] = [];
    for (let i = 0; i < 20; i++) {
      const id = newId('evt');
      written.push(id);
      await insertOutboxEvent(db, { id, type: 'test.n', subject, tenantId: 'acme' });
    }
    const seen: string[] = [];
    let next = await first;
    for (;;) {
      for (const event of next.value ?? []) seen.push(event.id);
      if (seen.length >= 20) break;
      // Dawdle, so the hub's queue for us overflows at least once (a longer pause only helps).
      await new Promise((r) => setTimeout(r, 60));
      next = await follower.next();
    }
    controller.abort();
    await follower.return(undefined);
    expect(seen).toEqual(written);
    expect(hub.overflows()).toBeGreaterThan(0);
    expect(hub.liveFollowers()).toBe(0);
  });
});
