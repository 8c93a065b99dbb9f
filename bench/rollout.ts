/**
 * A rollout of a signed bcd release across a simulated fleet, everything real in one process: a
 * private PostgreSQL, the Temporal dev server with a worker hosting the rollout workflow, the API,
 * the gateway with mutual TLS, and N `bcd sim` agents (each with its own key, certificate, session,
 * journal and A/B slots) in P pools whose disruption budget is 10% each. It reports:
 *   - the rollout's total time (create to completed) at the given soak;
 *   - the peak nodes updating at once per pool, replayed from the outbox (never above the budget);
 *   - command latency during the rollout: `inventory.refresh` to random nodes at a steady rate,
 *     enqueue's commit to the result stored, p50 and p99, beside the same measured before it.
 * Usage: node --import tsx bench/rollout.ts [--nodes 1000] [--pools 4] [--soak-seconds 2]
 *        [--rate 10]
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { startSimulatedFleet } from '../daemon/sim.ts';
import { enqueueNodeCommand } from '../db/nodes/commands.ts';
import { insertPool, insertSite } from '../db/nodes/fleet.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { generateReleaseSigningKey, releaseFileEntry, signRelease } from '../domain/release-manifest.ts';
import { currentProtocolVersion } from '../domain/release-version.ts';
import { startGateway } from '../gateway/server.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { connectTemporal } from '../temporal/client.ts';
import { startWorker } from '../temporal/worker.ts';
import { benchDatabase, benchTemporal, percentile } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '1000' },
    pools: { type: 'string', default: '4' },
    'soak-seconds': { type: 'string', default: '2' },
    rate: { type: 'string', default: '10' },
  },
});
const nodes = Number(values.nodes);
const poolCount = Number(values.pools);
const soakSeconds = Number(values['soak-seconds']);
const rate = Number(values.rate);
const log = createLogger({ level: 'warn', name: 'bench' });
const secret = randomBytes(32).toString('hex');
const signer = generateReleaseSigningKey();

const bench = await benchDatabase('rollout', { max: 40 });
const { address, stop: stopTemporal } = await benchTemporal(log);
const taskQueue = `bench-rollout-${randomBytes(4).toString('hex')}`;
const config = parseConfig({
  BETTER_COMPUTE_SECRET: secret,
  BETTER_COMPUTE_RELEASE_PINS: signer.pin,
  BETTER_COMPUTE_TASK_QUEUE: taskQueue,
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
});
const temporal = await connectTemporal({ address });
const worker = await startWorker({
  db: bench.db,
  log,
  iam: { recordUsage: async () => {} } as never,
  address,
  taskQueue,
  sweeper: false,
});
const iam = createEmbeddedIam({ db: bench.db, log });
const platform = await bootstrapPlatform(iam);
const compute = createCompute({ config, db: bench.db, log, iam, temporal: temporal.client });
const root = { token: platform.rootAdminToken };
const gateway = await startGateway({
  config,
  db: bench.db,
  log,
  host: '127.0.0.1',
  port: 0,
  options: { deliveryIntervalMs: 100, heartbeatIntervalMs: 5_000, leaseMs: 30_000 },
});
const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-rollout-'));
const fleets = [];
const siteId = await insertSite(bench.db, { name: 'bench', region: 'eu-central-1' });
const poolIds: string[] = [];
const trust = { pins: [signer.pin], threshold: 1 };
const started = Date.now();
try {
  for (let p = 0; p < poolCount; p++) {
    const poolId = await insertPool(bench.db, {
      siteId,
      ownerTenantId: platform.rootTenantId,
      name: `pool-${p}`,
      gpuModel: 'h100',
      policy: { disruption: { maxUnavailable: '10%', soakSeconds } },
    });
    poolIds.push(poolId);
    const size = Math.floor(nodes / poolCount) + (p < nodes % poolCount ? 1 : 0);
    const { token } = await createJoinToken(bench.db, { poolId, ttlSeconds: 3600, maxUses: size });
    fleets.push(
      await startSimulatedFleet({
        gatewayAddress: gateway.address,
        caCertificatePem: gateway.caCertificatePem,
        joinToken: token,
        nodes: size,
        rootDir: path.join(dir, `pool-${p}`),
        namePrefix: `p${p}`,
        log,
        joinConcurrency: 16,
        minBackoffMs: 200,
        maxBackoffMs: 2_000,
        bcd: { version: '1.0.0', trust },
      }),
    );
  }
  for (;;) {
    const { rows } = await sql<{ n: string }>`SELECT count(*) AS n FROM nodes WHERE connectivity = 'connected'
      AND provision_state = 'ready'`.execute(bench.db);
    if (Number(rows[0]!.n) >= nodes) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const joinedSeconds = (Date.now() - started) / 1000;

  const files = new Map([['bin/bcd', Buffer.from('#!/bin/sh\n# simulated bcd 1.1.0\n')]]);
  const manifest = {
    channel: 'stable',
    version: '1.1.0',
    protocolVersion: currentProtocolVersion,
    minControlPlaneVersion: '0.1.0',
    files: [...files].map(([p, c]) => releaseFileEntry(p, c)),
    expiresAt: new Date(Date.now() + 86_400_000).toISOString(),
  };
  const release = await compute.api.releases.publish(root, {
    manifest,
    signatures: [signRelease(manifest, signer.privateKeyPem)],
    files: [...files].map(([p, c]) => ({ path: p, content: c.toString('base64') })),
  });

  const nodeIds = (await bench.db.selectFrom('nodes').select('id').execute()).map((n) => n.id);
  const latencies = async (until: () => boolean, seconds: number) => {
    const samples: number[] = [];
    const pending: Array<Promise<void>> = [];
    const end = Date.now() + seconds * 1000;
    while (until() && Date.now() < end) {
      const nodeId = nodeIds[Math.floor(Math.random() * nodeIds.length)]!;
      pending.push(
        (async () => {
          const t0 = performance.now();
          const { id } = await bench.db
            .transaction()
            .execute((trx) =>
              enqueueNodeCommand(trx, { nodeId, kind: 'inventory.refresh', notAfterSeconds: 120 }),
            );
          for (let i = 0; i < 600; i++) {
            const row = await bench.db
              .selectFrom('node_commands')
              .select('state')
              .where('id', '=', id)
              .executeTakeFirst();
            if (row && ['succeeded', 'failed', 'expired'].includes(row.state)) {
              if (row.state === 'succeeded') samples.push(performance.now() - t0);
              return;
            }
            await new Promise((r) => setTimeout(r, 20));
          }
        })(),
      );
      await new Promise((r) => setTimeout(r, 1000 / rate));
    }
    await Promise.all(pending);
    return samples.sort((a, b) => a - b);
  };
  const before = await latencies(() => true, 15);

  const t0 = Date.now();
  const rollout = await compute.api.rollouts.create(root, {
    releaseId: release.id,
    selector: { poolIds },
    idempotencyKey: 'bench',
  });
  let state = 'running';
  const poll = (async () => {
    while (state === 'running') {
      state = (await compute.api.rollouts.get(root, { rolloutId: rollout.id })).state;
      await new Promise((r) => setTimeout(r, 500));
    }
  })();
  const during = await latencies(() => state === 'running', 3600);
  await poll;
  const totalSeconds = (Date.now() - t0) / 1000;
  const final = await compute.api.rollouts.get(root, { rolloutId: rollout.id });

  // Peak per pool, replayed from the outbox in commit order.
  const { rows: events } = await sql<{ type: string; data: { nodeId?: string; poolId?: string } }>`
    SELECT type, data FROM outbox_events WHERE subject = ${`rollout/${rollout.id}`} ORDER BY xid, seq`.execute(
    bench.db,
  );
  const now = new Map<string, Set<string>>();
  const peak = new Map<string, number>();
  for (const e of events) {
    if (!e.data.nodeId || !e.data.poolId) continue;
    const set = now.get(e.data.poolId) ?? new Set();
    now.set(e.data.poolId, set);
    if (e.type === 'rollout.node-updating') set.add(e.data.nodeId);
    if (['rollout.node-updated', 'rollout.node-failed'].includes(e.type)) set.delete(e.data.nodeId);
    peak.set(e.data.poolId, Math.max(peak.get(e.data.poolId) ?? 0, set.size));
  }
  const ms = (s: number[], p: number) => (s.length ? percentile(s, p * 100).toFixed(0) : 'n/a');
  console.log(
    JSON.stringify(
      {
        nodes,
        pools: poolCount,
        soakSeconds,
        joinedSeconds: Math.round(joinedSeconds),
        state: final.state,
        done: final.waves.reduce((n, w) => n + w.done, 0),
        failed: final.waves.reduce((n, w) => n + w.failed, 0),
        totalSeconds: Math.round(totalSeconds),
        budgets: final.budgets.map((b) => ({
          poolId: b.poolId,
          maxUpdating: b.maxUpdating,
          peak: peak.get(b.poolId) ?? 0,
        })),
        commandLatencyMs: {
          before: { n: before.length, p50: ms(before, 0.5), p99: ms(before, 0.99) },
          during: { n: during.length, p50: ms(during, 0.5), p99: ms(during, 0.99) },
        },
        loadAverage: loadavg().map((l) => l.toFixed(2)),
      },
      null,
      2,
    ),
  );
} finally {
  await Promise.all(fleets.map((f) => f.stop()));
  await gateway.stop();
  await worker.stop();
  await temporal.close();
  await stopTemporal?.();
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
