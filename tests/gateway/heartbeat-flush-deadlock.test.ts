import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createOutageLog } from '../../core/outage-log.ts';
import { transactionRetryingConflicts } from '../../db/conflict-retry.ts';
import { enqueueNodeCommand } from '../../db/nodes/commands.ts';
import { Dispatcher } from '../../gateway/dispatch.ts';
import { NodeRateLimits } from '../../gateway/node-rate-limits.ts';
import { defaultGatewayOptions } from '../../gateway/options.ts';
import { SessionRegistry } from '../../gateway/registry.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';
import { testLogger } from '../support/logger.ts';

/**
 * The gateway's heartbeat flush and liveness sweep against each other and against a transaction
 * that writes many nodes in its own order (a rollout step enqueues a `bcd.update` per node it
 * starts, in wave order), on real PostgreSQL. Before the flush stopped waiting for row locks, the
 * second case failed with `deadlock detected` within a few rounds.
 */
const t = useTestDatabase({ max: 16 });
let ids: string[];
const rounds = 30;
// Each round is a few real transactions racing on 200 rows: slow on a loaded machine, never stuck.
const stressTimeoutMs = 240_000;

beforeAll(async () => {
  const { nodes } = await seedPool(t.db, {
    site: 'deadlock-site',
    nodes: 200,
    shape: { gpus: 1, gpuModel: 'h100', gpuMemoryMiB: 1, nvlinkDomainSize: 1, numaNodes: 1, resources: {} },
  });
  ids = nodes.map((n) => n.id);
});

function gateway(gatewayId: string): { dispatcher: Dispatcher; registry: SessionRegistry } {
  const options = { ...defaultGatewayOptions, gatewayId, trustDomain: 'test.local' };
  const registry = new SessionRegistry(options);
  const dispatcher = new Dispatcher({
    db: t.db,
    log: testLogger(),
    outage: createOutageLog(testLogger(), 'retrying'),
    options,
    registry,
    rates: new NodeRateLimits(options),
  });
  return { dispatcher, registry };
}

function shuffled<T>(items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** Every node connected, on gw_a, with a heartbeat 10 minutes old: all are due for the sweep. */
async function everyNodeSilent(): Promise<void> {
  await sql`UPDATE nodes SET connectivity = 'connected', session_gateway = 'gw_a',
    last_heartbeat_at = compute_now() - interval '10 minutes'`.execute(t.db);
  await sql`DELETE FROM node_conditions`.execute(t.db);
}

/** Hears `nodeIds` (in that order) on a gateway, as its sessions would. */
function hear(registry: SessionRegistry, nodeIds: readonly string[]): void {
  for (const id of nodeIds) registry.heard.set(id, 0);
}

/** Flushes until nothing heard is left (rows skipped while held come back for the next flush). */
async function drain(...gateways: Array<ReturnType<typeof gateway>>): Promise<void> {
  for (let round = 0; round < 20 && gateways.some((g) => g.registry.heard.size > 0); round++) {
    for (const g of gateways) await g.dispatcher.flushHeartbeats();
  }
  for (const g of gateways) expect(g.registry.heard.size).toBe(0);
}

function rejections(outcomes: PromiseSettledResult<unknown>[]): string[] {
  return outcomes
    .filter((o): o is PromiseRejectedResult => o.status === 'rejected')
    .map((o) => `${(o.reason as { code?: string }).code ?? ''} ${String(o.reason)}`);
}

/**
 * A heard node is connected on one of `gateways` with a fresh heartbeat and no NodeUnreachable;
 * every other node is unreachable on no gateway, with NodeUnreachable.
 */
async function expectLiveness(heard: ReadonlySet<string>, gateways: readonly string[]): Promise<void> {
  const { rows } = await sql<{
    id: string;
    connectivity: string;
    session_gateway: string | null;
    fresh: boolean;
    flagged: boolean;
  }>`
    SELECT n.id, n.connectivity, n.session_gateway,
      n.last_heartbeat_at > compute_now() - interval '1 minute' AS fresh,
      EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = n.id AND c.type = 'NodeUnreachable') AS flagged
    FROM nodes n`.execute(t.db);
  const wrong = rows.filter((r) =>
    heard.has(r.id)
      ? !(
          r.connectivity === 'connected' &&
          r.fresh &&
          !r.flagged &&
          gateways.includes(r.session_gateway ?? '')
        )
      : !(r.connectivity === 'unreachable' && r.session_gateway === null && r.flagged),
  );
  expect(wrong).toEqual([]);
}

describe('the heartbeat flush and the liveness sweep under concurrency', () => {
  it(
    'two gateways flushing overlapping nodes and two sweeps, run together, never fail',
    async () => {
      const a = gateway('gw_a');
      const b = gateway('gw_b');
      for (let round = 0; round < rounds; round++) {
        await everyNodeSilent();
        const heardA = shuffled(ids).slice(0, 120);
        const heardB = shuffled(ids).slice(0, 120);
        hear(a.registry, heardA);
        hear(b.registry, heardB);
        const outcomes = await Promise.allSettled(
          shuffled([
            () => a.dispatcher.flushHeartbeats(),
            () => b.dispatcher.flushHeartbeats(),
            () => a.dispatcher.sweepLiveness(),
            () => b.dispatcher.sweepLiveness(),
          ]).map((run) => run()),
        );
        expect(rejections(outcomes)).toEqual([]);
        await drain(a, b);
        // Rows a flush held were skipped by the sweeps: one quiet sweep settles everything silent.
        await a.dispatcher.sweepLiveness();
        await expectLiveness(new Set([...heardA, ...heardB]), ['gw_a', 'gw_b']);
      }
    },
    stressTimeoutMs,
  );

  it(
    'a transaction writing many nodes in its own order deadlocks neither the flush nor the sweep',
    async () => {
      const a = gateway('gw_a');
      const before = await t.db
        .selectFrom('node_commands')
        .select(sql<string>`count(*)`.as('n'))
        .executeTakeFirst();
      const writes: Array<{ nodeId: string }> = [];
      for (let round = 0; round < rounds; round++) {
        await everyNodeSilent();
        const heard = shuffled(ids).slice(0, 150);
        hear(a.registry, heard);
        // As a rollout step: one command per node it starts, in its own (here random) order.
        const started = shuffled(ids).slice(0, 40);
        const outcomes = await Promise.allSettled([
          a.dispatcher.flushHeartbeats(),
          a.dispatcher.sweepLiveness(),
          t.db.transaction().execute(async (trx) => {
            for (const nodeId of started)
              await enqueueNodeCommand(trx, { nodeId, kind: 'inventory.refresh' });
          }),
        ]);
        expect(rejections(outcomes)).toEqual([]);
        writes.push(...started.map((nodeId) => ({ nodeId })));
        await drain(a);
        await a.dispatcher.sweepLiveness();
        await expectLiveness(new Set(heard), ['gw_a']);
      }
      const after = await t.db
        .selectFrom('node_commands')
        .select(sql<string>`count(*)`.as('n'))
        .executeTakeFirst();
      expect(Number(after!.n) - Number(before!.n)).toBe(writes.length);
    },
    stressTimeoutMs,
  );

  it('a heartbeat whose node another transaction holds is written by the next flush, never waited for', async () => {
    const a = gateway('gw_a');
    await everyNodeSilent();
    const [held, free] = ids as [string, string];
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const holding = new Promise<void>((r) => (locked = r));
    const holder = t.db.transaction().execute(async (trx) => {
      await sql`SELECT 1 FROM nodes WHERE id = ${held} FOR UPDATE`.execute(trx);
      locked();
      await released;
    });
    await holding;
    hear(a.registry, [held, free]);
    // The flush returns while the row is still held: the free node is written, the held one waits.
    await a.dispatcher.flushHeartbeats();
    expect([...a.registry.heard.keys()]).toEqual([held]);
    release();
    await holder;
    await drain(a);
    await a.dispatcher.sweepLiveness();
    const { rows } = await sql<{ id: string; connectivity: string }>`
      SELECT id, connectivity FROM nodes WHERE id IN (${held}, ${free}) ORDER BY id`.execute(t.db);
    expect(rows.map((r) => r.connectivity)).toEqual(['connected', 'connected']);
  });
});

describe('transactionRetryingConflicts', () => {
  it('runs a transaction PostgreSQL chose as a deadlock victim again, so both sides commit', async () => {
    const [first, second] = ids as [string, string];
    const seqOf = async () =>
      (
        await t.db
          .selectFrom('nodes')
          .select(['id', 'next_command_seq'])
          .where('id', 'in', [first, second])
          .orderBy('id')
          .execute()
      ).map((r) => Number(r.next_command_seq));
    const start = await seqOf();
    let attempts = 0;
    let arrivals = 0;
    let bothHoldOne!: () => void;
    const barrier = new Promise<void>((r) => (bothHoldOne = r));
    // Opposite orders, each waiting (first attempt only) until the other holds its first row: a
    // certain deadlock, which PostgreSQL breaks by rolling one of them back.
    const bump = (order: [string, string]) =>
      transactionRetryingConflicts(t.db, async (trx) => {
        const attempt = ++attempts;
        await sql`UPDATE nodes SET next_command_seq = next_command_seq + 1 WHERE id = ${order[0]}`.execute(
          trx,
        );
        if (attempt <= 2) {
          if (++arrivals === 2) bothHoldOne();
          await barrier;
        }
        await sql`UPDATE nodes SET next_command_seq = next_command_seq + 1 WHERE id = ${order[1]}`.execute(
          trx,
        );
      });
    const outcomes = await Promise.allSettled([bump([first, second]), bump([second, first])]);
    expect(rejections(outcomes)).toEqual([]);
    expect(attempts).toBe(3);
    expect(await seqOf()).toEqual(start.map((s) => s + 2));
  });
});
