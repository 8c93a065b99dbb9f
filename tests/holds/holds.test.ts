import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PlacementContention, withPlacementTransaction } from '../../db/allocations/placement.ts';
import { advanceComputeClock } from '../../db/clock.ts';
import { announceExpiredHolds } from '../../db/holds/holds.ts';
import { countHostOversells } from '../../db/holds/invariants.ts';
import { holderName } from '../../domain/holds.ts';
import { createHoldsWorld, type HoldsWorld, hostShape } from './fixture.ts';

let w: HoldsWorld;
const tenantId = 'acme';

beforeAll(async () => {
  w = await createHoldsWorld();
}, 120_000);

afterAll(async () => {
  await w?.api.stop();
});

const hold = (target: string, kind: string, extra: Record<string, unknown> = {}) =>
  w.call('holds/create', { tenantId, target, kind, path: 'test', pid: 42, ...extra });

async function nodeRow(poolId: string, nodeId: string) {
  const answer = await w.call('capacity/nodes', { tenantId, poolId });
  expect(answer.status).toBe(200);
  return answer.body.data.nodes.find((n: { nodeId: string }) => n.nodeId === nodeId);
}

describe('host holds', () => {
  it('32 concurrent holds and reservations racing for the last cores of one node never oversell it, 5 races in a row', async () => {
    for (let race = 0; race < 5; race++) {
      // 16 cores and 64 GiB: room for 8 takers of 2 cores and 4 GiB, whichever they are.
      const { poolId, nodes } = await w.pool(`race${race}`, 1, hostShape(16, 16, 64));
      const node = nodes[0]!;
      const attempts = Array.from({ length: 32 }, (_, i) =>
        i % 2 === 0
          ? hold(node.name, 'notebook', { idempotencyKey: `race${race}-hold-${i}` })
          : w.call('reservations/create', {
              tenantId,
              poolId,
              devices: [{ class: 'gpu', count: 1 }],
              duration: '1h',
              resources: { vcpu: 2, memoryGiB: 4 },
              idempotencyKey: `race${race}-rsv-${i}`,
            }),
      );
      const answers = await Promise.all(attempts);
      // Every answer is a hold, a placed or pending reservation, or a typed capacity refusal:
      // contention is never an error (the loser queues on the node's rows and sees the winner).
      const outcomes = answers.map((a, i) =>
        a.status === 200
          ? i % 2 === 0
            ? 'held'
            : a.body.data.state
          : `${a.status} ${a.body.error.code}: ${a.body.error.message}`,
      );
      for (const [i, outcome] of outcomes.entries()) {
        expect([i % 2 === 0 ? 'held' : 'placed', 'pending', '503 CAPACITY_UNAVAILABLE']).toContain(
          outcome.startsWith('503 CAPACITY_UNAVAILABLE') ? '503 CAPACITY_UNAVAILABLE' : outcome,
        );
      }
      const holds = outcomes.filter((o) => o === 'held').length;
      const placed = outcomes.filter((o) => o === 'placed').length;
      // The node is filled exactly: every taker that lost found it full, not contended.
      // (Which kind wins how many is a matter of timing, not asserted: any split of the 8 is right.)
      expect(holds + placed).toBe(8);
      expect(await countHostOversells(w.api.database.db)).toBe(0);
      const { rows } = await sql<{ cores: string }>`
        SELECT COALESCE(sum(amount), 0) AS cores FROM (
          SELECT amount, during FROM scalar_bookings WHERE node_id = ${node.id} AND resource = 'vcpu'
          UNION ALL SELECT amount, during FROM hold_bookings WHERE node_id = ${node.id} AND resource = 'vcpu') b
        WHERE during @> compute_now()`.execute(w.api.database.db);
      expect(Number(rows[0]!.cores)).toBe(16);
      console.log(
        `race ${race + 1}: ${holds} holds and ${placed} reservations took ${rows[0]!.cores} of 16 cores`,
      );
    }
  });

  it('publishes capacity net of holds; a holder that stops heartbeating loses the hold after its TTL and the room comes back', async () => {
    const { poolId, nodes } = await w.pool('ttl', 1, hostShape(1, 8, 32));
    const node = nodes[0]!;
    const before = await nodeRow(poolId, node.id);
    expect(before.availableCpuCores).toBe(8);
    expect(before.vcpu.free).toBe(8);

    const taken = await hold(node.name, 'notebook');
    expect(taken.status).toBe(200);
    expect(taken.body.data).toMatchObject({
      state: 'live',
      ttlSeconds: 180,
      cpuCores: 2,
      ramGiB: 4,
      holder: 'acme-user@acme test pid 42',
    });
    const during = await nodeRow(poolId, node.id);
    expect(during).toMatchObject({
      availableCpuCores: 6,
      freeRamGiB: 28,
      measured: { availableCpuCores: 8, freeRamGiB: 32 },
      runningWorkloads: 1,
      reserved: { cpuCores: 2, ramGiB: 4, vramGiB: 0 },
      acceptingJobs: true,
    });
    expect(during.vcpu.free).toBe(6);
    expect(during.holds.map((h: { id: string }) => h.id)).toEqual([taken.body.data.id]);

    // A heartbeat before the TTL keeps it: 170 s later, heartbeat, 170 s later still live.
    await advanceComputeClock(w.api.database.db, 170_000);
    const beat = await w.call('holds/heartbeat', { tenantId, holdId: taken.body.data.id });
    expect(beat.status).toBe(200);
    await advanceComputeClock(w.api.database.db, 170_000);
    expect((await w.call('holds/get', { tenantId, holdId: taken.body.data.id })).body.data.state).toBe(
      'live',
    );
    expect((await nodeRow(poolId, node.id)).availableCpuCores).toBe(6);

    // Then the holder goes quiet: after the TTL the hold has expired and the cores are back.
    await advanceComputeClock(w.api.database.db, 11_000);
    const after = await nodeRow(poolId, node.id);
    expect(after).toMatchObject({ availableCpuCores: 8, freeRamGiB: 32, runningWorkloads: 0 });
    expect(after.vcpu.free).toBe(8);
    const expired = await w.call('holds/get', { tenantId, holdId: taken.body.data.id });
    expect(expired.body.data.state).toBe('expired');
    const late = await w.call('holds/heartbeat', { tenantId, holdId: taken.body.data.id });
    expect(late.body.error.code).toBe('INVALID_STATE');
    // And the room can be taken again: four notebooks fit in 8 cores, a fifth does not.
    for (let i = 0; i < 4; i++) expect((await hold(node.name, 'notebook')).status).toBe(200);
    expect((await hold(node.name, 'diagnostics')).body.error.code).toBe('CAPACITY_UNAVAILABLE');
  });

  it('refuses with the exact sentences, and takes a quiet host on trust', async () => {
    const { poolId, nodes } = await w.pool('words', 3, hostShape(1, 3, 5));
    const [a, b, c] = nodes as [
      { id: string; name: string },
      { id: string; name: string },
      { id: string; name: string },
    ];

    const unknown = await hold(a.name, 'browser');
    expect(unknown.status).toBe(503);
    expect(unknown.body.error.code).toBe('CAPACITY_UNAVAILABLE');
    expect(unknown.body.error.message).toBe(
      "workload kind 'browser' declares no reservation; declare it with holds.kinds.set",
    );

    expect((await hold(a.name, 'notebook')).status).toBe(200);
    const noRoom = await hold(a.name, 'notebook');
    expect(noRoom.body.error.message).toBe(
      `${a.name} has no room for notebook: needs 2 cores and 4 GiB, host publishes 1 cores and 1 GiB net of 1 reservation(s); pick another host with --target or wait for a reservation to end`,
    );
    expect(noRoom.body.error.details).toMatchObject({
      reason: 'no-room',
      needs: { cpuCores: 2, ramGiB: 4 },
      publishes: { cpuCores: 1, ramGiB: 1 },
      holds: 1,
    });

    // One core and one GiB more leaves none: the host publishes that it takes no work.
    expect((await hold(a.name, 'diagnostics')).status).toBe(200);
    const exhausted = await hold(a.name, 'diagnostics');
    expect(exhausted.body.error.message).toBe(
      `${a.name} is not accepting placements (reservations_exhausted); pick another host with --target or wait for it to clear`,
    );
    const row = await nodeRow(poolId, a.id);
    expect(row).toMatchObject({
      acceptingJobs: false,
      admissionReason: 'reservations_exhausted',
      acceptsWork: false,
    });
    expect(row.refusals).toContain('reservations_exhausted');
    // The placer honours it: a reservation asking no host resources is not placed there.
    const preview = await w.call('capacity/preview', {
      tenantId,
      poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
    });
    expect(preview.body.data.fits).toBe(true);
    expect(preview.body.data.nodeId).not.toBe(a.id);

    await w.api.database.db
      .updateTable('nodes')
      .set({ cordoned: true, cordon_reason: 'disk swap' })
      .where('id', '=', b.id)
      .execute();
    const cordoned = await hold(b.name, 'diagnostics');
    expect(cordoned.body.error.message).toBe(
      `${b.name} is not accepting placements (cordoned (disk swap)); pick another host with --target or wait for it to clear`,
    );

    // A connected host whose capacity row states no CPU figure.
    const bare = await w.pool('bare', 1, hostShape(1, null, null));
    const noField = await hold(bare.nodes[0]!.name, 'diagnostics');
    expect(noField.body.error.message).toBe(
      `${bare.nodes[0]!.name} publishes no availableCpuCores in its capacity row, so whether the hold fits cannot be judged; update its agent or pick another host with --target`,
    );
    const bareRow = await nodeRow(bare.poolId, bare.nodes[0]!.id);
    expect(bareRow).toMatchObject({ availableCpuCores: null, freeRamGiB: null });

    // A host with no fresh publication is taken on trust: the hold is written.
    await w.api.database.db
      .updateTable('nodes')
      .set({ connectivity: 'unreachable' })
      .where('id', '=', c.id)
      .execute();
    const trusted = await hold(c.name, 'notebook');
    expect(trusted.status).toBe(200);
    expect(trusted.body.data.onTrust).toBe(true);
  });

  it('lists released and expired holds for an hour, marked as ended, and not after', async () => {
    const { nodes } = await w.pool('ended', 1, hostShape(1, 8, 32));
    const node = nodes[0]!;
    const taken = (await hold(node.name, 'diagnostics')).body.data;
    const released = await w.call('holds/release', { tenantId, holdId: taken.id });
    expect(released.body.data.state).toBe('released');
    expect((await w.call('holds/release', { tenantId, holdId: taken.id })).body.data.state).toBe('released');
    const list = async () =>
      (await w.call('holds/list', { tenantId, target: node.name })).body.data.holds.map(
        (h: { id: string; state: string }) => `${h.id}:${h.state}`,
      );
    expect(await list()).toEqual([`${taken.id}:released`]);
    await advanceComputeClock(w.api.database.db, 59 * 60_000);
    expect(await list()).toEqual([`${taken.id}:released`]);
    await advanceComputeClock(w.api.database.db, 2 * 60_000);
    expect(await list()).toEqual([]);
    expect((await w.call('holds/get', { tenantId, holdId: taken.id })).body.error.code).toBe('NOT_FOUND');
  });

  it('counts one refusal once in the ledger when the client retries with the same idempotency key', async () => {
    const { poolId, nodes } = await w.pool('ledger', 1, hostShape(2, 1, 64));
    const node = nodes[0]!;
    for (let i = 0; i < 3; i++) {
      const refused = await hold(node.name, 'notebook', { idempotencyKey: 'retry-me' });
      expect(refused.body.error.code).toBe('CAPACITY_UNAVAILABLE');
    }
    await hold(node.name, 'notebook'); // without a key: a refusal of its own
    // A reservation that goes pending, retried with its key: one entry.
    for (let i = 0; i < 2; i++) {
      const pending = await w.call('reservations/create', {
        tenantId,
        poolId,
        devices: [{ class: 'gpu', count: 4 }],
        duration: '1h',
        idempotencyKey: 'too-big',
      });
      expect(pending.body.data.state).toBe('pending');
    }
    const report = await w.call('capacity/demand', { tenantId, poolId });
    expect(report.status).toBe(200);
    const data = report.body.data;
    expect(data.total).toBe(3);
    expect(data.byReason).toEqual(
      expect.arrayContaining([
        { key: 'no-room', count: 2 },
        { key: 'pending', count: 1 },
      ]),
    );
    expect(data.topShapes[0]).toMatchObject({ shape: 'hold notebook: 2 cores, 4 GiB', count: 2 });
    expect(data.byTenant).toEqual([{ key: 'acme', count: 3 }]);
    const why = data.pending.find((p: { shape: string }) => p.shape.startsWith('4 gpu'));
    expect(why, JSON.stringify(data.pending)).toMatchObject({
      queuePosition: 1,
      queueLength: 1,
      earliestStart: null,
    });
    expect(why.blocking).toEqual([{ reason: 'devices', nodes: 1, message: '1 lacks 4 free GPUs' }]);
  });

  it('answers a placement that lost every bounded retry as UNAVAILABLE with retryAfterSeconds, never INTERNAL', async () => {
    let calls = 0;
    const lost = await withPlacementTransaction(
      w.api.database.db,
      async () => {
        calls++;
        throw new PlacementContention();
      },
      3,
    ).catch((error: unknown) => error);
    expect(calls).toBe(3);
    expect(lost).toMatchObject({
      code: 'UNAVAILABLE',
      details: { reason: 'placement-contention', retryAfterSeconds: 1 },
    });
    // A deadlock broken by PostgreSQL on every attempt ends the same way.
    const deadlocked = await withPlacementTransaction(
      w.api.database.db,
      async (trx) => {
        await sql`DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$`.execute(trx);
      },
      2,
    ).catch((error: unknown) => error);
    expect(deadlocked).toMatchObject({ code: 'UNAVAILABLE', details: { reason: 'placement-contention' } });
    expect((deadlocked as Error).message).toMatch(/retry it \(with the same idempotency key\)$/);
  });

  it('writes the audit row and the event of a hold taken and released, and hold.expired once for a lapsed one', async () => {
    const { nodes } = await w.pool('records', 1, hostShape(1, 8, 32));
    const node = nodes[0]!;
    const records = async (holdId: string) => ({
      events: (
        await w.api.database.db
          .selectFrom('outbox_events')
          .select(['type', 'tenant_id', 'data'])
          .where('subject', '=', `hold/${holdId}`)
          .orderBy('seq')
          .execute()
      ).map((e) => ({ type: e.type, tenantId: e.tenant_id, data: e.data as Record<string, unknown> })),
      audit: await w.api.database.db
        .selectFrom('audit_events')
        .select(['actor_identity_id', 'action', 'tenant_id', 'context'])
        .where('resource_type', '=', 'compute-hold')
        .where('resource_id', '=', holdId)
        .orderBy('id')
        .execute(),
    });

    const taken = (await hold(node.name, 'notebook', { idempotencyKey: 'recorded' })).body.data;
    // A retry with the same key answers the same hold and writes nothing more.
    expect((await hold(node.name, 'notebook', { idempotencyKey: 'recorded' })).body.data.id).toBe(taken.id);
    await w.call('holds/heartbeat', { tenantId, holdId: taken.id });
    expect((await w.call('holds/release', { tenantId, holdId: taken.id })).status).toBe(200);
    expect((await w.call('holds/release', { tenantId, holdId: taken.id })).status).toBe(200);
    const { events, audit } = await records(taken.id);
    expect(events.map((e) => e.type)).toEqual(['hold.created', 'hold.released']);
    expect(events[0]).toMatchObject({
      tenantId,
      data: {
        holdId: taken.id,
        nodeId: node.id,
        target: node.name,
        kind: 'notebook',
        cpuCores: 2,
        ramGiB: 4,
        state: 'live',
      },
    });
    expect(events[1]!.data).toMatchObject({ state: 'released', endedAt: expect.any(Number) });
    expect(audit.map((a) => [a.actor_identity_id, a.action, a.tenant_id])).toEqual([
      [w.acme.identityId, 'compute:capacity:hold', tenantId],
      [w.acme.identityId, 'compute:capacity:hold', tenantId],
    ]);
    expect(audit.map((a) => a.context)).toEqual([
      expect.objectContaining({
        method: 'holds.create',
        change: 'hold.created',
        nodeId: node.id,
        kind: 'notebook',
      }),
      expect.objectContaining({
        method: 'holds.release',
        change: 'hold.released',
        nodeId: node.id,
        kind: 'notebook',
      }),
    ]);

    // A refusal is the ledger's, not the audit's or the outbox's.
    const before = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM outbox_events WHERE type LIKE 'hold.%'`.execute(w.api.database.db);
    expect((await hold(node.name, 'browser')).body.error.code).toBe('CAPACITY_UNAVAILABLE');
    const after = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM outbox_events WHERE type LIKE 'hold.%'`.execute(w.api.database.db);
    expect(after.rows[0]!.n).toBe(before.rows[0]!.n);

    // A holder that goes quiet: concurrent sweeps announce the lapse exactly once.
    const quiet = (await hold(node.name, 'diagnostics', { ttlSeconds: 10 })).body.data;
    const sweep = () =>
      w.api.database.db
        .transaction()
        .execute((trx) => announceExpiredHolds(trx, { nodeId: node.id, limit: 100 }));
    expect(await sweep()).toEqual([]);
    await advanceComputeClock(w.api.database.db, 11_000);
    const swept = await Promise.all([sweep(), sweep(), sweep()]);
    expect(swept.flat()).toEqual([quiet.id]);
    expect(await sweep()).toEqual([]);
    const lapsed = await records(quiet.id);
    expect(lapsed.events.map((e) => e.type)).toEqual(['hold.created', 'hold.expired']);
    expect(lapsed.events[1]!.data).toMatchObject({ state: 'expired', holdId: quiet.id, kind: 'diagnostics' });
    // Released after it lapsed: the release changes nothing and writes nothing.
    await w.call('holds/release', { tenantId, holdId: quiet.id });
    expect((await records(quiet.id)).events.map((e) => e.type)).toEqual(['hold.created', 'hold.expired']);
  });

  it('names the holder from the identity, and names no one it cannot', () => {
    expect(holderName({ name: 'operator', tenantId: 'acme' }, { path: 'hold 2s', pid: 31618 })).toBe(
      'operator@acme hold 2s pid 31618',
    );
    expect(holderName({ name: '  ', tenantId: 'acme' }, {})).toBeNull();
    expect(holderName({ name: undefined, tenantId: 'acme' }, { pid: 1 })).toBeNull();
  });
});
