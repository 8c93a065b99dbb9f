import { sql, type Transaction } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../core/database.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { countHostOversells } from '../../db/holds/invariants.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import type { HostResource } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool, smallShape } from '../support/fleet.ts';

// The scalar guard of scalar_bookings (migration 2026-12-07T01): one statement trigger checks all
// the rows an insert wrote together; updates keep a row trigger. Writers here take no lock of
// their own first, so the guard is all that keeps them apart.

type Trx = Transaction<Database>;

const t = useTestDatabase({ max: 40 });
const hour = 3_600_000;
const base = new Date('2031-01-01T00:00:00Z').getTime();
let poolId: string;
let nodes: RegisteredNode[];

beforeAll(async () => {
  ({ poolId, nodes } = await seedPool(t.db, {
    nodes: 6,
    shape: { ...smallShape, resources: { vcpu: 100, memoryGiB: 400 } },
  }));
});

interface Booking {
  allocationId: string;
  nodeId: string;
  resource: HostResource;
  amount: number;
  /** Hours after `base`. */
  from: number;
  to: number;
}

const range = (from: number, to: number) =>
  `[${new Date(base + from * hour).toISOString()},${new Date(base + to * hour).toISOString()})`;

/** `count` allocations on `node` (each in a reservation of its own), committed. */
function allocations(node: RegisteredNode, count: number): Promise<string[]> {
  return t.db.transaction().execute(async (trx) => {
    const ids: string[] = [];
    for (let i = 0; i < count; i++) {
      ids.push(
        await insertBareAllocation(trx, {
          poolId,
          nodeId: node.id,
          start: new Date(base),
          end: new Date(base + hour),
        }),
      );
    }
    return ids;
  });
}

/** `rows` in one INSERT statement, in the order given. */
async function insertBookings(trx: Trx, rows: readonly Booking[]): Promise<void> {
  await trx
    .insertInto('scalar_bookings')
    .values(
      rows.map((r) => ({
        allocation_id: r.allocationId,
        node_id: r.nodeId,
        resource: r.resource,
        amount: r.amount,
        during: range(r.from, r.to),
      })),
    )
    .execute();
}

/** A hold of `amount` cores on `node` with its booking, as one writer would take it without locks. */
async function insertHold(
  trx: Trx,
  node: RegisteredNode,
  amount: number,
  from: number,
  to: number,
): Promise<void> {
  const holdId = newId('hold');
  await trx
    .insertInto('host_holds')
    .values({
      id: holdId,
      tenant_id: 'tnt_test',
      pool_id: poolId,
      node_id: node.id,
      kind: 'notebook',
      holder: 'test',
      owner_identity_id: 'idn_test',
      idempotency_key: null,
      cpu_cores: amount,
      ram_gib: 0,
      vram_gib: 0,
      ttl_seconds: 3_600,
    })
    .execute();
  await trx
    .insertInto('hold_bookings')
    .values({ hold_id: holdId, node_id: node.id, resource: 'vcpu', amount, during: range(from, to) })
    .execute();
}

/** The scalar bookings of `node`: allocation, resource, amount and the hour (after `base`) each ends. */
async function bookingsOf(node: RegisteredNode) {
  const { rows } = await sql<{ allocation_id: string; resource: string; amount: string; until: Date }>`
    SELECT allocation_id, resource, amount::text, upper(during) AS until FROM scalar_bookings
    WHERE node_id = ${node.id} ORDER BY allocation_id, resource`.execute(t.db);
  return rows.map(({ until, ...r }) => ({ ...r, to: (until.getTime() - base) / hour }));
}

/** Runs `writers` concurrent transactions (each on a connection of its own); answers how each ended. */
async function race(writers: number, write: (trx: Trx, i: number) => Promise<void>) {
  const outcomes = await Promise.allSettled(
    Array.from({ length: writers }, (_, i) =>
      t.db.transaction().execute(async (trx) => {
        await write(trx, i);
        // Held a moment past the guard, so the others queue behind its locks.
        await sql`SELECT pg_sleep(0.02)`.execute(trx);
      }),
    ),
  );
  const codes = outcomes.map((o) =>
    o.status === 'fulfilled' ? 'committed' : (o.reason as { code?: string }).code,
  );
  return {
    committed: codes.filter((c) => c === 'committed').length,
    refusals: codes.filter((c) => c !== 'committed'),
  };
}

describe('the scalar guard of an insert statement', () => {
  it('refuses rows that together over-book a resource, each fitting alone, and leaves nothing', async () => {
    const node = nodes[0]!;
    const [a, b] = await allocations(node, 2);
    const rows: Booking[] = [a!, b!].map((allocationId) => ({
      allocationId,
      nodeId: node.id,
      resource: 'vcpu',
      amount: 60,
      from: 0,
      to: 2,
    }));
    await t.db.transaction().execute(async (trx) => {
      for (const row of rows) {
        await sql`SAVEPOINT alone`.execute(trx);
        await insertBookings(trx, [row]);
        await sql`ROLLBACK TO SAVEPOINT alone`.execute(trx);
      }
    });
    await expect(t.db.transaction().execute((trx) => insertBookings(trx, rows))).rejects.toMatchObject({
      code: 'BC001',
      message: `scalar resource vcpu of node ${node.id} over-booked: 60 booked + 60 asked > 100 allocatable`,
    });
    expect(await bookingsOf(node)).toEqual([]);
  });

  it('books rows of different nodes that each fit', async () => {
    const [first, second] = [nodes[1]!, nodes[2]!];
    const [a] = await allocations(first, 1);
    const [b] = await allocations(second, 1);
    await t.db.transaction().execute((trx) =>
      insertBookings(trx, [
        { allocationId: a!, nodeId: first.id, resource: 'vcpu', amount: 60, from: 0, to: 2 },
        { allocationId: b!, nodeId: second.id, resource: 'vcpu', amount: 60, from: 0, to: 2 },
      ]),
    );
    expect((await bookingsOf(first)).map((r) => r.amount)).toEqual(['60']);
    expect((await bookingsOf(second)).map((r) => r.amount)).toEqual(['60']);
  });

  it('fails a row whose resource row is missing on the foreign key, as before', async () => {
    const node = nodes[0]!;
    const [a] = await allocations(node, 1);
    await expect(
      t.db
        .transaction()
        .execute((trx) =>
          insertBookings(trx, [
            { allocationId: a!, nodeId: node.id, resource: 'hugepages2Mi', amount: 1, from: 0, to: 1 },
          ]),
        ),
    ).rejects.toMatchObject({ code: '23503' });
  });

  it('lets 16 concurrent writers of two nodes fill them exactly, in either row order, without a deadlock', async () => {
    const [first, second] = [nodes[1]!, nodes[2]!];
    const ids = { [first.id]: await allocations(first, 16), [second.id]: await allocations(second, 16) };
    const { committed, refusals } = await race(16, (trx, i) => {
      const rows: Booking[] = [first, second].map((node) => ({
        allocationId: ids[node.id]![i]!,
        nodeId: node.id,
        resource: 'vcpu',
        amount: 10,
        from: 10,
        to: 12,
      }));
      return insertBookings(trx, i % 2 === 0 ? rows : rows.reverse());
    });
    // 100 cores each, 10 a writer: the first ten to the locks fit, the other six find them full.
    expect(committed).toBe(10);
    expect(refusals).toEqual(Array(6).fill('BC001'));
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });

  it('lets holds and reservations racing for one node take its cores exactly once between them', async () => {
    const node = nodes[3]!;
    const ids = await allocations(node, 16);
    const { committed, refusals } = await race(16, (trx, i) =>
      i % 2 === 0
        ? insertHold(trx, node, 10, 0, 4)
        : insertBookings(trx, [
            { allocationId: ids[i]!, nodeId: node.id, resource: 'vcpu', amount: 10, from: 1, to: 3 },
          ]),
    );
    expect(committed).toBe(10);
    expect(refusals).toEqual(Array(6).fill('BC001'));
    expect(await countHostOversells(t.db)).toBe(0);
  });
});

describe('the scalar guard of an update', () => {
  it('refuses an update that over-books and lets one that shrinks a booking through', async () => {
    const node = nodes[4]!;
    const [a, b] = await allocations(node, 2);
    await t.db.transaction().execute((trx) =>
      insertBookings(trx, [
        { allocationId: a!, nodeId: node.id, resource: 'vcpu', amount: 60, from: 0, to: 2 },
        { allocationId: b!, nodeId: node.id, resource: 'vcpu', amount: 50, from: 2, to: 4 },
      ]),
    );
    const extend = sql`UPDATE scalar_bookings SET during = ${range(0, 3)}::tstzrange WHERE allocation_id = ${a!}`;
    await expect(extend.execute(t.db)).rejects.toMatchObject({
      code: 'BC001',
      message: `scalar resource vcpu of node ${node.id} over-booked: 50 booked + 60 asked > 100 allocatable`,
    });
    // Shrinking needs no room: it passes even on a node now allocating less than is booked.
    await sql`UPDATE host_resources SET allocatable = 40 WHERE node_id = ${node.id} AND resource = 'vcpu'`.execute(
      t.db,
    );
    await sql`UPDATE scalar_bookings SET during = ${range(0, 1)}::tstzrange, amount = 50 WHERE allocation_id = ${a!}`.execute(
      t.db,
    );
    expect(await bookingsOf(node)).toEqual([
      { allocation_id: a!, resource: 'vcpu', amount: '50', to: 1 },
      { allocation_id: b!, resource: 'vcpu', amount: '50', to: 4 },
    ]);
  });
});
