import { rmSync } from 'node:fs';
import path from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import { type LocalPostgres, startLocalPostgres } from '../../db/local-postgres.ts';
import { migrateToLatest } from '../../db/migrate.ts';
import { enqueueNodeCommand } from '../../db/nodes/commands.ts';
import { createDb, type DbHandle } from '../../db/pool.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { eventually } from '../support/eventually.ts';
import { seedPool } from '../support/fleet.ts';
import { gatewayTestLog, joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { makeStackDir } from '../support/temp-dir.ts';

/**
 * Commands are pushed at the enqueue's commit (LISTEN/NOTIFY), not found by a poll: with the
 * fallback poll at 10 s, every command still reaches its node well within a second, and after
 * PostgreSQL restarts the gateway listens again. A private PostgreSQL, since this test restarts it.
 */
describe('command delivery pushed by the commit', () => {
  const fallbackPollMs = 10_000;
  const dir = makeStackDir('bc-command-push-');
  let postgres: LocalPostgres;
  let handle: DbHandle;
  let gateway: StartedGateway;
  let fleet: SimulatedFleet;
  let nodeIds: string[];

  const startPostgres = (port?: number) =>
    startLocalPostgres({
      dataDir: path.join(dir, 'postgres'),
      database: 'push',
      log: gatewayTestLog,
      ephemeral: true,
      ...(port ? { port, strictPort: true } : {}),
    });

  beforeAll(async () => {
    postgres = await startPostgres();
    handle = createDb(postgres.url, { max: 8 });
    await migrateToLatest(handle.db);
    const { poolId } = await seedPool(handle.db, { site: 'dc-push' });
    gateway = await startTestGateway({ db: handle.db, options: { commandPollMs: fallbackPollMs } });
    fleet = await joinSimulatedFleet(gateway, handle.db, poolId, {
      nodes: 4,
      rootDir: path.join(dir, 'fleet'),
    });
    await eventually(async () => gateway.sessionCount() === 4, 60_000);
    await eventually(async () => gateway.stats().commandNotifications.listening);
    nodeIds = fleet.nodes.map((n) => n.nodeId);
  });

  afterAll(async () => {
    await fleet?.stop();
    await gateway?.stop();
    await handle?.close();
    await postgres?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /**
   * Enqueues `count` commands one after another (round robin over the nodes); answers each id with
   * the database's clock just before its commit.
   */
  async function enqueue(count: number): Promise<Array<{ id: string; committing: Date }>> {
    const enqueued: Array<{ id: string; committing: Date }> = [];
    for (let i = 0; i < count; i++) {
      const nodeId = nodeIds[i % nodeIds.length]!;
      enqueued.push(
        await handle.db.transaction().execute(async (trx) => {
          const { id } = await enqueueNodeCommand(trx, { nodeId, kind: 'inventory.refresh' });
          const { rows } = await sql<{ at: Date }>`SELECT clock_timestamp() AS at`.execute(trx);
          return { id, committing: rows[0]!.at };
        }),
      );
    }
    return enqueued;
  }

  /** From the enqueue's commit to the command marked delivered, by the database's clock, ascending (ms). */
  async function deliveryLatencies(enqueued: Array<{ id: string; committing: Date }>): Promise<number[]> {
    const rows = await eventually(async () => {
      const { rows } = await sql<{ id: string; delivered_at: Date | null }>`
        SELECT id, delivered_at FROM node_commands
        WHERE id = ANY(${enqueued.map((e) => e.id)}::text[])`.execute(handle.db);
      return rows.length === enqueued.length && rows.every((r) => r.delivered_at !== null) ? rows : null;
    }, 30_000);
    const deliveredAt = new Map(rows.map((r) => [r.id, r.delivered_at!.getTime()]));
    return enqueued.map((e) => deliveredAt.get(e.id)! - e.committing.getTime()).sort((a, b) => a - b);
  }

  it('delivers 50 commands each well before the fallback poll would (p99 under 1 s)', async () => {
    const enqueued = await enqueue(50);
    const latencies = await deliveryLatencies(enqueued);
    const p99 = latencies[Math.min(latencies.length - 1, Math.floor(0.99 * latencies.length))]!;
    gatewayTestLog.info({ p50: latencies[25], p99, max: latencies.at(-1) }, 'command delivery latency');
    expect(latencies).toHaveLength(50);
    expect(p99).toBeLessThan(1_000);
    // And the nodes ran them.
    await eventually(async () => {
      const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM node_commands
        WHERE id = ANY(${enqueued.map((e) => e.id)}::text[]) AND state = 'succeeded'`.execute(handle.db);
      return rows[0]!.n === 50;
    }, 30_000);
  });

  it('listens again after PostgreSQL restarts, and pushes again', async () => {
    const before = gateway.stats().commandNotifications.connections;
    const port = postgres.port;
    await postgres.stop();
    postgres = await startPostgres(port);
    await eventually(async () => {
      const { listening, connections } = gateway.stats().commandNotifications;
      return listening && connections > before;
    }, 30_000);
    const enqueued = await eventually(() => enqueue(8), 30_000);
    const latencies = await deliveryLatencies(enqueued);
    expect(latencies.at(-1)!).toBeLessThan(1_000);
  });
});
