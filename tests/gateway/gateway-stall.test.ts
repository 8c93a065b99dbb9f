import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';

describe('a gateway whose event loop stood still', () => {
  const fx = useGatewayFixture(
    { leaseMs: 1_500, heartbeatIntervalMs: 250 },
    { nodes: 3, minBackoffMs: 100, maxBackoffMs: 1_000, until: 'connected' },
  );

  it('does not lapse the sessions whose heartbeats wait unread in its sockets', async () => {
    const db = fx.database.db;
    const ids = fx.fleet.nodes.map((n) => n.nodeId);
    const epochs = async () =>
      Object.fromEntries(
        (await db.selectFrom('nodes').select(['id', 'epoch']).where('id', 'in', ids).execute()).map((r) => [
          r.id,
          Number(r.epoch),
        ]),
      );
    const before = await epochs();

    // The fault: this process (the gateway and the simulated nodes in it) blocks for twice the
    // lease, as a long GC pause or a starved process would. The nodes' heartbeats meanwhile wait
    // in the sockets; on resuming, the timers run before any of them is read.
    const blockedUntil = performance.now() + 3_000;
    while (performance.now() < blockedUntil) {
      // the event loop stands still
    }

    // The heartbeats read after the pause reach PostgreSQL...
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(db);
    const resumedAt = rows[0]!.now;
    await eventually(async () => {
      const nodes = await db
        .selectFrom('nodes')
        .select(['last_heartbeat_at', 'connectivity'])
        .where('id', 'in', ids)
        .execute();
      return nodes.every((n) => n.connectivity === 'connected' && n.last_heartbeat_at! > resumedAt);
    });
    // ...on the sessions that were open before it: none lapsed, none was swept unreachable.
    expect(await epochs()).toEqual(before);
    expect(fx.gateway.sessionCount()).toBe(3);
    const unreachable = await db
      .selectFrom('node_conditions')
      .select('node_id')
      .where('type', '=', 'NodeUnreachable')
      .execute();
    expect(unreachable).toEqual([]);
  });
});
