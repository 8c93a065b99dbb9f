import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { enqueueNodeCommand, findNodeCommand, markCommandsDelivered } from '../../db/nodes/commands.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { setNodeConditions } from '../../db/nodes/nodes.ts';
import { openNodeSession } from '../../db/nodes/sessions.ts';
import { newId } from '../../domain/ids.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

// openNodeSession is one statement: what the transaction of several did, each part checked here.
const t = useTestDatabase();
let node: RegisteredNode;

beforeAll(async () => {
  node = (await seedPool(t.db, { nodes: 1 })).nodes[0]!;
});

const open = (journalId: string, capabilities: string[] = []) =>
  openNodeSession(t.db, {
    nodeId: node.id,
    gatewayId: 'gw_test',
    agentVersion: 'test',
    protocolVersion: 1,
    capabilities,
    journalId,
  });

const labels = async (nodeId: string) =>
  (
    await t.db
      .selectFrom('node_labels')
      .select(['key', 'source'])
      .where('node_id', '=', nodeId)
      .where('key', 'like', 'bc.dev/cap.%')
      .orderBy('key')
      .execute()
  ).map((l) => l.key);

const conditionTypes = async (nodeId: string) =>
  (await t.db.selectFrom('node_conditions').select('type').where('node_id', '=', nodeId).execute()).map(
    (c) => c.type,
  );

describe('opening a session in one statement', () => {
  it('answers the commands its journal took, with their times, and the inventory hashes held', async () => {
    const first = await open('journal-aaaa', ['mig', 'cgroups']);
    const notAfter = new Date(Date.now() + 3_600_000); // wall time: a deadline an hour ahead
    const command = await t.db.transaction().execute((trx) =>
      enqueueNodeCommand(trx, {
        nodeId: node.id,
        kind: 'diag.nvml',
        notAfter,
        minGeneration: 1,
      }),
    );
    expect([
      ...(await markCommandsDelivered(t.db, [{ commandId: command.id, journalId: 'journal-aaaa' }])),
    ]).toEqual([command.id]);
    await t.db
      .insertInto('inventory_snapshots')
      .values([
        { node_id: node.id, section: 'host', hash: 'h-old', data: '{}' },
        { node_id: node.id, section: 'host', hash: 'h-new', data: '{}' },
      ])
      .execute();
    await setNodeConditions(t.db, node.id, {
      set: [{ type: 'NodeUnreachable', reason: 'Unreachable', message: 'test', effect: 'NoSchedule' }],
      clear: [],
    });
    await t.db.updateTable('nodes').set({ connectivity: 'unreachable' }).where('id', '=', node.id).execute();

    const again = await open('journal-aaaa', ['mig']);
    expect(again.epoch).toBe(first.epoch + 1);
    expect(again.wasUnreachable).toBe(true);
    expect(again.failedInFlight).toBe(0);
    expect(again.redeliver).toEqual([
      {
        id: command.id,
        seq: command.seq,
        kind: 'diag.nvml',
        lane: command.lane,
        payload: { level: 'quick' },
        notBefore: null,
        notAfter,
        minGeneration: 1,
      },
    ]);
    expect(again.heldSectionHashes).toEqual(new Map([['host', 'h-new']]));
    expect(await labels(node.id)).toEqual(['bc.dev/cap.mig']);
    expect(await conditionTypes(node.id)).toEqual([]);
  });

  it('fails what a lost journal had in flight and sends nothing again', async () => {
    const before = await t.db
      .selectFrom('node_commands')
      .select('id')
      .where('node_id', '=', node.id)
      .where('state', '=', 'delivered')
      .execute();
    expect(before).toHaveLength(1);
    const opened = await open('journal-bbbb');
    expect(opened.failedInFlight).toBe(1);
    expect(opened.redeliver).toEqual([]);
    const failed = await findNodeCommand(t.db, before[0]!.id);
    expect(failed).toMatchObject({ state: 'failed', error: 'the node lost its journal' });
    expect(await labels(node.id)).toEqual([]);
    // The same journal again is not a loss.
    expect((await open('journal-bbbb')).failedInFlight).toBe(0);
  });

  it('clears a NodeUnreachable that a liveness sweep raised while the opening waited for the node', async () => {
    // A sweep's transaction (markSessionsUnreachable) holds the node's row with the condition
    // written; the opening's statement began before it committed, so its snapshot cannot see it.
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let held!: () => void;
    const holding = new Promise<void>((resolve) => {
      held = resolve;
    });
    const sweep = t.db.transaction().execute(async (trx) => {
      await trx.updateTable('nodes').set({ connectivity: 'unreachable' }).where('id', '=', node.id).execute();
      await setNodeConditions(trx, node.id, {
        set: [{ type: 'NodeUnreachable', reason: 'Unreachable', message: 'sweep', effect: 'NoSchedule' }],
        clear: [],
      });
      held();
      await released;
    });
    await holding;
    const opening = open('journal-bbbb');
    await expect
      .poll(async () => {
        const { rows } = await sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%WITH before AS%'`.execute(
          t.db,
        );
        return rows[0]!.n;
      })
      .toBe(1);
    release();
    await sweep;
    const opened = await opening;
    expect(opened.wasUnreachable).toBe(true);
    expect(await conditionTypes(node.id)).toEqual([]);
  });

  it('answers NOT_FOUND for a node that no longer exists and writes nothing', async () => {
    const missing = newId('node');
    await expect(
      openNodeSession(t.db, {
        nodeId: missing,
        gatewayId: 'gw_test',
        agentVersion: 'test',
        protocolVersion: 1,
        capabilities: ['mig'],
        journalId: 'journal-cccc',
      }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND' });
    expect(await labels(missing)).toEqual([]);
  });
});
