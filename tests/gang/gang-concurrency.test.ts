import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { setOperatorLabels } from '../../db/nodes/labels.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';

/**
 * 64 concurrent gang and single-node requests on 16 two-GPU nodes in two fabric domains, with the
 * lifecycle running (pending ones retry every second): the database referees every booking, a
 * gang is whole or absent, and the quota used is exactly what the live reservations charged.
 */
const h = useLifecycleApi({
  name: 'gang-concurrency',
  nodes: 16,
  // Nodes without daemons: nothing binds, so nothing churns through bind timeouts meanwhile.
  timers: { bindTimeoutMs: 600_000 },
  pool: { gpuQuota: 1_000 },
});

beforeAll(async () => {
  await setOperatorLabels(
    h.db,
    h.nodes.map((n, i) => ({ nodeId: n.id, key: 'fabric.domain', value: i < 8 ? 'fabric-a' : 'fabric-b' })),
  );
});

const request = (i: number) => {
  const gang =
    i % 4 === 0 ? { size: 2 + (i % 3), ...(i % 8 === 0 ? { topologyKey: 'fabric.domain' } : {}) } : null;
  return {
    tenantId: 'acme',
    poolId: h.poolId,
    devices: [{ class: 'gpu' as const, count: 1 + (i % 2) }],
    duration: '1h',
    ...(gang ? { gang } : {}),
    idempotencyKey: `storm-${i}`,
  };
};

/** The invariants, each read in one statement. */
async function checkInvariants() {
  const overlaps = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM device_bookings a JOIN device_bookings b
      ON a.device_id = b.device_id AND a.allocation_id < b.allocation_id AND a.during && b.during`.execute(
    h.db,
  );
  expect(overlaps.rows[0]!.n).toBe(0);

  // Every gang past pending holds exactly `size` current members on distinct nodes, one value each.
  const gangs = await sql<{
    id: string;
    size: number;
    members: number;
    nodes: number;
    values: number;
    key: string | null;
  }>`
    SELECT r.id, r.gang_size AS size, count(a.id)::int AS members, count(DISTINCT a.node_id)::int AS nodes,
           count(DISTINCT l.value)::int AS values, r.request->'gang'->>'topologyKey' AS key
    FROM reservations r
    JOIN allocations a ON a.reservation_id = r.id AND a.superseded_at IS NULL
    LEFT JOIN node_labels l ON l.node_id = a.node_id AND l.key = 'fabric.domain'
    WHERE r.gang_size > 1 AND r.state IN ('placed', 'binding', 'active')
    GROUP BY r.id`.execute(h.db);
  for (const g of gangs.rows) {
    expect(g.members).toBe(g.size);
    expect(g.nodes).toBe(g.size);
    if (g.key) expect(g.values).toBe(1);
  }
  const pendingWithAllocations = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM reservations r JOIN allocations a ON a.reservation_id = r.id AND a.superseded_at IS NULL
    WHERE r.state = 'pending'`.execute(h.db);
  expect(pendingWithAllocations.rows[0]!.n).toBe(0);

  // Quota used = what the live reservations ask for (count × gang size) = the unrefunded charges.
  const quota = await sql<{ used: string; live: string; charged: string }>`
    SELECT (SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${h.poolId} AND resource = 'gpu') AS used,
           (SELECT COALESCE(sum((r.request->'devices'->0->>'count')::int * r.gang_size), 0) FROM reservations r
             WHERE r.tenant_id = 'acme' AND r.state IN ('pending', 'placed', 'binding', 'active')) AS live,
           (SELECT COALESCE(sum(amount), 0) FROM quota_charges
             WHERE tenant_id = 'acme' AND resource = 'gpu' AND refunded_at IS NULL) AS charged`.execute(h.db);
  const { used, live, charged } = quota.rows[0]!;
  expect(Number(used)).toBe(Number(live));
  expect(Number(charged)).toBe(Number(live));
  return { gangs: gangs.rows.length, used: Number(used) };
}

describe('64 concurrent gang and single requests', () => {
  it('leave no overlapping booking, no half gang, and quota equal to the live reservations', async () => {
    const results = await Promise.all(
      Array.from({ length: 64 }, (_, i) => h.compute.api.reservations.create(h.credential, request(i))),
    );
    const placed = results.filter((r) => r.state === 'placed');
    expect(placed.length).toBeGreaterThan(0);
    expect(results.filter((r) => r.state === 'pending').length).toBeGreaterThan(0);
    const first = await checkInvariants();
    expect(first.used).toBe(results.reduce((n, r) => n + gpusOf(r.request), 0));

    // Free half of what was placed at once: pending gangs and singles race for it.
    await Promise.all(
      placed
        .filter((_, i) => i % 2 === 0)
        .map((r) =>
          h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: r.id }),
        ),
    );
    await expect
      .poll(
        async () => {
          const { rows } = await sql<{ n: number }>`
            SELECT count(*)::int AS n FROM reservations WHERE tenant_id = 'acme' AND state IN ('placed', 'binding')
              AND idempotency_key LIKE 'storm-%'`.execute(h.db);
          return rows[0]!.n;
        },
        { timeout: 30_000, interval: 250 },
      )
      .toBeGreaterThan(placed.length - Math.ceil(placed.length / 2));
    await checkInvariants();
  });
});

function gpusOf(request: Record<string, unknown>): number {
  const devices = request.devices as Array<{ count: number }>;
  const gang = request.gang as { size: number } | undefined;
  return devices[0]!.count * (gang?.size ?? 1);
}
