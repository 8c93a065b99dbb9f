import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createLogger } from '../../core/logger.ts';
import { newId } from '../../domain/ids.ts';
import { outboxHead, outboxStart, readOutbox } from '../../events/outbox.ts';
import { createOutboxHub } from '../../events/outbox-hub.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase({ max: 6 });
});
afterAll(async () => {
  await database.drop();
});

async function insertEvent(db: TestDatabase['db'], type: string) {
  await db
    .insertInto('outbox_events')
    .values({ id: newId('evt'), type, subject: 'reservation/rsv_x', tenant_id: 'acme', data: '{}' })
    .execute();
}

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
      const first = await readOutbox(db, head, { tenantId: 'acme' }, 100);
      expect(first.events.map((e) => e.type)).toEqual(['test.b']);

      await a.query('COMMIT');
      const second = await readOutbox(db, first.cursor, { tenantId: 'acme' }, 100);
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
      const after = await readOutbox(db, whileOpen.cursor, { tenantId: 'acme' }, 100);
      expect(after.events.map((e) => e.type)).toEqual(['test.newer']);
    } finally {
      older.release();
    }
  });

  test('filters by subject, type pattern and tenant', async () => {
    const db = database.db;
    await db
      .insertInto('outbox_events')
      .values([
        { id: newId('evt'), type: 'node.cordoned', subject: 'node/node_1', tenant_id: null, data: '{}' },
        {
          id: newId('evt'),
          type: 'reservation.active',
          subject: 'reservation/rsv_y',
          tenant_id: 'globex',
          data: '{}',
        },
      ])
      .execute();
    const all = await readOutbox(db, outboxStart, { tenantId: null, types: ['node.*'] }, 100);
    expect(all.events.map((e) => e.type)).toEqual(['node.cordoned']);
    const globex = await readOutbox(db, outboxStart, { tenantId: 'globex' }, 100);
    expect(globex.events.map((e) => e.subject)).toEqual(['reservation/rsv_y']);
    const bySubject = await readOutbox(
      db,
      outboxStart,
      { tenantId: 'acme', subject: 'reservation/rsv_x' },
      100,
    );
    expect(bySubject.events.map((e) => e.type)).toEqual(['test.b', 'test.a', 'test.c', 'test.newer']);
  });

  test('the shared tail: a follower that falls too far behind reads on its own, losing and repeating nothing', async () => {
    const db = database.db;
    const hub = createOutboxHub({ db, log: createLogger({ level: 'silent' }) }, { pollMs: 20, maxQueue: 5 });
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
    await new Promise((r) => setTimeout(r, 100));
    expect(hub.liveFollowers()).toBe(1);
    const written: string[] = [];
    for (let i = 0; i < 20; i++) {
      const id = newId('evt');
      written.push(id);
      await db
        .insertInto('outbox_events')
        .values({ id, type: 'test.n', subject, tenant_id: 'acme', data: '{}' })
        .execute();
    }
    const seen: string[] = [];
    let next = await first;
    for (;;) {
      for (const event of next.value ?? []) seen.push(event.id);
      if (seen.length >= 20) break;
      // Dawdle, so the hub's queue for us overflows at least once.
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
