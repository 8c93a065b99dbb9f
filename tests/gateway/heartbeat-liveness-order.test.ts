import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createOutageLog } from '../../core/outage-log.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { Dispatcher } from '../../gateway/dispatch.ts';
import { NodeRateLimits } from '../../gateway/node-rate-limits.ts';
import { defaultGatewayOptions } from '../../gateway/options.ts';
import { SessionRegistry } from '../../gateway/registry.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';
import { testLogger } from '../support/logger.ts';

const t = useTestDatabase({ max: 20 });
let nodes: RegisteredNode[];

beforeAll(async () => {
  ({ nodes } = await seedPool(t.db, {
    site: 'order-site',
    nodes: 400,
    shape: { gpus: 1, gpuModel: 'h100', gpuMemoryMiB: 1, nvlinkDomainSize: 1, numaNodes: 1, resources: {} },
  }));
});

describe('the heartbeat flush and the liveness sweep', () => {
  it('never deadlock on the same nodes, and a heard node ends up connected', async () => {
    const options = { ...defaultGatewayOptions, gatewayId: 'gw_test', trustDomain: 'test.local' };
    const registry = new SessionRegistry(options);
    const dispatcher = new Dispatcher({
      db: t.db,
      log: testLogger(),
      outage: createOutageLog(testLogger(), 'retrying'),
      options,
      registry,
      rates: new NodeRateLimits(options),
    });
    // Reverse id order on purpose: the order a map of live sessions happens to hold.
    const heardOrder = [...nodes].sort((a, b) => b.id.localeCompare(a.id));
    for (let round = 0; round < 15; round++) {
      await sql`UPDATE nodes SET last_heartbeat_at = compute_now() - interval '10 minutes', connectivity = 'connected'`.execute(
        t.db,
      );
      for (const node of heardOrder) registry.heard.set(node.id, 0);
      const outcomes = await Promise.allSettled([dispatcher.flushHeartbeats(), dispatcher.sweepLiveness()]);
      expect(
        outcomes.filter((o) => o.status === 'rejected').map((o) => (o as PromiseRejectedResult).reason),
      ).toEqual([]);
    }
    for (const node of nodes) registry.heard.set(node.id, 0);
    await dispatcher.flushHeartbeats();
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM nodes WHERE connectivity = 'connected'`.execute(t.db);
    expect(Number(rows[0]!.n)).toBe(nodes.length);
  });
});
