import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { findLease, poolLeaseName } from '../../db/leases.ts';
import { countQueued } from '../../db/reservations/pool-queue.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import { startWatchdog, type Watchdog } from '../../server/supervise.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { callApi } from '../support/api.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { eventually } from '../support/eventually.ts';
import { type SeededPool, seedPool, smallShape } from '../support/fleet.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import { PlaneChild } from '../support/plane-children.ts';

// Two worker processes serve one pool-lease pool; the lease holder is SIGKILLed while it drains
// the queue. The standby takes the lease under a higher epoch once it expires, and every request
// is decided exactly once.
const timers = { bindTimeoutMs: 120_000, pendingRetryMs: 2_000, maxPendingMs: 300_000, recheckMs: 30_000 };
let t: TestDatabase;
let watchdog: Watchdog;
let temporal: TemporalClientHandle;
let compute: Compute;
let pool: SeededPool;
let acme: TenantMember;
let globex: TenantMember;
let workerA: PlaneChild;
let workerB: PlaneChild;

beforeAll(async () => {
  const log = testLogger('pool-lease-failover');
  t = await createTestDatabase();
  const iam = createEmbeddedIam({ db: t.db, log });
  await bootstrapPlatform(iam);
  acme = await tenantMember(iam, 'acme');
  globex = await tenantMember(iam, 'globex');
  pool = await seedPool(t.db, {
    site: 'failover-site',
    nodes: 30,
    shape: smallShape,
    policy: { placer: 'pool-lease', poolLease: { batchSize: 3 } },
    offers: { acme: { gpu: 1_000 }, globex: { gpu: 1_000 } },
  });
  watchdog = startWatchdog();
  const temporalAddress = inject('temporalAddress');
  const taskQueue = `pool-lease-failover-${randomBytes(4).toString('hex')}`;
  temporal = await connectTemporal({ address: temporalAddress });
  compute = createCompute({
    config: parseConfig({
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
    }),
    db: t.db,
    log,
    iam,
    temporal: temporal.client,
    lifecycle: createTemporalLifecycle(temporal.client, { taskQueue, timers }),
  });
  const worker = () =>
    new PlaneChild(
      {
        role: 'worker',
        databaseUrl: t.url,
        temporalAddress,
        taskQueue,
        timers,
        activityTimeoutMs: 5_000,
        poolPlacer: { leaseTtlMs: 2_000, pollMs: 500 },
      },
      watchdog,
    );
  workerA = worker();
  workerB = worker();
});

afterAll(async () => {
  await workerA?.kill();
  await workerB?.kill();
  await watchdog?.stop();
  await temporal?.close();
  await t?.drop();
});

const holderPid = async () => {
  const lease = await findLease(t.db, poolLeaseName(pool.poolId));
  return lease && !lease.expired ? { pid: Number(lease.holder.split(':')[1]), epoch: lease.epoch } : null;
};

describe('the pool-lease placer across worker processes', () => {
  it('a SIGKILLed holder loses the lease to the standby: nothing placed twice, nothing lost', async () => {
    await workerA.start();
    await eventually(async () => (await holderPid())?.pid === workerA.pid, 60_000);
    await workerB.start();
    const first = await holderPid();

    const creates = Array.from({ length: 36 }, (_, i) =>
      callApi(compute.app, (i % 2 ? globex : acme).token, 'reservations/create', {
        tenantId: i % 2 ? 'globex' : 'acme',
        poolId: pool.poolId,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '2h',
        idempotencyKey: `failover-${i}`,
      }),
    );
    // Kill the holder while it drains (its batches are 3 requests each).
    await eventually(async () => {
      const { rows } = await sql<{ n: string }>`
        SELECT count(*) AS n FROM reservations WHERE pool_id = ${pool.poolId} AND state IN ('placed', 'binding')`.execute(
        t.db,
      );
      return Number(rows[0]!.n) > 0;
    }, 60_000);
    await workerA.kill();
    const answers = await Promise.all(creates);
    for (const a of answers) expect(a.status, JSON.stringify(a.body)).toBe(200);
    const ids = answers.map((a) => a.body.data.id as string);

    // The standby holds the lease under a higher epoch and drains the rest.
    await eventually(async () => {
      const now = await holderPid();
      return now !== null && now.pid === workerB.pid && now.epoch > first!.epoch;
    }, 60_000);
    await eventually(async () => (await countQueued(t.db, pool.poolId)) === 0, 90_000);

    // Nothing lost: every request is placed (60 GPUs for 36); nothing placed twice.
    const { rows } = await sql<{ id: string; state: string; allocations: string; placed_events: string }>`
      SELECT r.id, r.state,
        (SELECT count(*) FROM allocations a WHERE a.reservation_id = r.id) AS allocations,
        (SELECT count(*) FROM outbox_events e WHERE e.subject = 'reservation/' || r.id
           AND e.type = 'reservation.placed') AS placed_events
      FROM reservations r WHERE r.id = ANY(${ids}::text[])`.execute(t.db);
    expect(rows).toHaveLength(36);
    for (const row of rows) {
      expect(['placed', 'binding'], row.id).toContain(row.state);
      expect(Number(row.allocations), row.id).toBe(1);
      expect(Number(row.placed_events), row.id).toBe(1);
    }
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  }, 400_000);
});
