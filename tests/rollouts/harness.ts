import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { sql } from 'kysely';
import type { SimBehaviour } from '../../daemon/self-update.ts';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import type { DisruptionPolicy } from '../../domain/rollout-policy.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import { type ApiAnswer, type ApiFixture, callApi, createApiFixture } from '../support/api.ts';
import { eventually } from '../support/eventually.ts';
import { seedPool } from '../support/fleet.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { testLogger } from '../support/logger.ts';
import { startTestTemporal, type TestTemporal } from '../support/temporal.ts';
import { manifestOf, newSigner, publishBody, type Signer, simulatedBinary } from './support.ts';

/** The version every simulated node starts on (slot a). */
export const baseVersion = '0.1.0';

export interface RolloutStack {
  api: ApiFixture;
  compute: Compute;
  temporal: TestTemporal;
  gateway: StartedGateway;
  signer: Signer;
  pools: Array<{ id: string; name: string; nodes: number }>;
  fleets: SimulatedFleet[];
  /** Versions told to crash at start or report unhealthy, for every simulated node. */
  faults: Map<string, SimBehaviour>;
  call(path: string, body: unknown): Promise<ApiAnswer>;
  /** Publishes a signed simulated bcd `version` (its release id). */
  publish(version: string, behaviour?: 'crash-at-start' | 'unhealthy'): Promise<string>;
  /** rollouts.get, until `until` holds. */
  waitFor(rolloutId: string, until: (r: any) => boolean, timeoutMs?: number): Promise<any>;
  stop(): Promise<void>;
}

/**
 * The real thing in one process: a real database and API (root admin), the real Temporal dev server
 * with a worker hosting the rollout workflow, the gateway with mutual TLS, and pools of simulated
 * bcd nodes that pin the stack's release signer.
 */
export async function startRolloutStack(input: {
  name: string;
  pools: Array<{ name: string; nodes: number; disruption: DisruptionPolicy }>;
  /** The orphan sweeper's Schedule (off unless asked). */
  sweeper?: { everyMs: number; graceMs: number };
}): Promise<RolloutStack> {
  const signer = newSigner();
  const api = await createApiFixture({
    max: 30,
    env: {
      BETTER_COMPUTE_RELEASE_PINS: signer.pin,
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
    },
  });
  const log = testLogger(`rollout-${input.name}`);
  const temporal = await startTestTemporal({
    name: `rollout-${input.name}`,
    db: api.database.db,
    log,
    iam: api.iam,
    timers: {},
    ...(input.sweeper ? { sweeper: input.sweeper } : {}),
  });
  const compute = createCompute({
    ...api.deps,
    temporal: temporal.client,
    config: { ...api.deps.config, BETTER_COMPUTE_TASK_QUEUE: temporal.taskQueue },
  });
  // A long lease: a node loaded by a hundred others must not lose its session in its health gate.
  const gateway = await startTestGateway({
    db: api.database.db,
    options: { leaseMs: 30_000, heartbeatIntervalMs: 3_000 },
  });
  const dir = mkdtempSync(path.join(tmpdir(), 'bc-rollout-'));
  const faults = new Map<string, SimBehaviour>();
  const pools: RolloutStack['pools'] = [];
  const fleets: SimulatedFleet[] = [];
  let siteId: string | undefined;
  for (const pool of input.pools) {
    const seeded = await seedPool(api.database.db, {
      ...(siteId ? { siteId } : { site: 'dc-1', region: 'eu-1' }),
      name: pool.name,
      ownerTenantId: api.root.tenantId,
      policy: { disruption: pool.disruption },
    });
    siteId = seeded.siteId;
    pools.push({ id: seeded.poolId, name: pool.name, nodes: pool.nodes });
  }
  // The pools' fleets join at once (the gateway's join throttle spreads them).
  fleets.push(
    ...(await Promise.all(
      input.pools.map((pool, i) =>
        joinSimulatedFleet(gateway, api.database.db, pools[i]!.id, {
          nodes: pool.nodes,
          rootDir: path.join(dir, pool.name),
          namePrefix: pool.name,
          joinConcurrency: 8,
          minBackoffMs: 100,
          maxBackoffMs: 1_000,
          log,
          bcd: { version: baseVersion, trust: { pins: [signer.pin], threshold: 1 }, faults },
        }),
      ),
    )),
  );
  const total = input.pools.reduce((n, p) => n + p.nodes, 0);
  await eventually(async () => {
    const rows = await api.database.db
      .selectFrom('nodes')
      .select('provision_state')
      .where('connectivity', '=', 'connected')
      .execute();
    return rows.length === total && rows.every((r) => r.provision_state === 'ready');
  }, 120_000);
  const call = (p: string, body: unknown) => callApi(compute.app, api.root.token, p, body);
  return {
    api,
    compute,
    temporal,
    gateway,
    signer,
    pools,
    fleets,
    faults,
    call,
    async publish(version, behaviour) {
      const files = simulatedBinary(version, behaviour);
      const answer = await call('releases/publish', publishBody(manifestOf(version, files), [signer], files));
      if (answer.status !== 200) throw new Error(`publish ${version}: ${JSON.stringify(answer.body)}`);
      return answer.body.data.id as string;
    },
    async waitFor(rolloutId, until, timeoutMs = 180_000) {
      return eventually(async () => {
        const answer = await call('rollouts/get', { rolloutId, nodes: true });
        return until(answer.body.data) ? answer.body.data : null;
      }, timeoutMs);
    },
    async stop() {
      await Promise.all(fleets.map((f) => f.stop()));
      await gateway.stop();
      await temporal.stop();
      await api.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Node ids in progress per pool at every moment, replayed from the outbox in commit order. */
export async function peakInProgressFromEvents(
  stack: RolloutStack,
  rolloutId: string,
): Promise<{ peak: Map<string, number>; starts: number; events: number }> {
  const rows = await stack.api.database.db
    .selectFrom('outbox_events')
    .select(['type', 'data', 'seq'])
    .where('subject', '=', `rollout/${rolloutId}`)
    .orderBy(sql`xid`)
    .orderBy('seq')
    .execute();
  const now = new Map<string, Set<string>>();
  const peak = new Map<string, number>();
  let starts = 0;
  for (const row of rows) {
    const data = row.data as { nodeId?: string; poolId?: string };
    if (!data.nodeId || !data.poolId) continue;
    const set = now.get(data.poolId) ?? new Set<string>();
    now.set(data.poolId, set);
    if (row.type === 'rollout.node-updating' || row.type === 'rollout.node-rolling-back') {
      set.add(data.nodeId);
      starts++;
    }
    if (['rollout.node-updated', 'rollout.node-failed', 'rollout.node-rolled-back'].includes(row.type)) {
      set.delete(data.nodeId);
    }
    peak.set(data.poolId, Math.max(peak.get(data.poolId) ?? 0, set.size));
  }
  return { peak, starts, events: rows.length };
}
