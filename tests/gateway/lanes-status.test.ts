import { execFileSync } from 'node:child_process';
import { describe, expect, it, onTestFinished } from 'vitest';
import { readDaemonStatus } from '../../daemon/status.ts';
import { enqueueNodeCommand, findNodeCommand } from '../../db/nodes/commands.ts';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';

describe('lanes and bcd status', () => {
  const fx = useGatewayFixture(
    { credits: { control: 4, provision: 1, bulk: 1 } },
    { nodes: 1, until: 'connected' },
  );

  it('bulk work never blocks control commands, and each lane runs in seq order', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    // The bulk diagnostic runs until the test lets it finish (a fixed delay raced the control
    // command on a loaded machine).
    let finishDiagnostics!: () => void;
    const diagnosticsMayFinish = new Promise<void>((resolve) => {
      finishDiagnostics = resolve;
    });
    const diagnose = node.hardware.diagnose;
    node.hardware.diagnose = async function (this: typeof node.hardware, level: string) {
      await diagnosticsMayFinish;
      return diagnose.call(this, level);
    };
    onTestFinished(() => {
      finishDiagnostics();
      node.hardware.diagnose = diagnose;
    });
    const diag = (level: string) => ({ nodeId: node.nodeId, kind: 'diag.nvml', payload: { level } });
    const bulk = await db.transaction().execute(async (trx) => {
      const first = await enqueueNodeCommand(trx, diag('full'));
      const second = await enqueueNodeCommand(trx, diag('quick'));
      return [first, second];
    });
    const control = await db
      .transaction()
      .execute((trx) => enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'inventory.refresh' }));
    await eventually(async () => (await findNodeCommand(db, control.id))?.state === 'succeeded');
    // The control command finished while the first bulk one still ran and the second waited for
    // the lane's only credit.
    expect((await findNodeCommand(db, bulk[0]!.id))?.state).toBe('delivered');
    expect((await findNodeCommand(db, bulk[1]!.id))?.state).toBe('queued');
    finishDiagnostics();
    await eventually(async () => (await findNodeCommand(db, bulk[1]!.id))?.state === 'succeeded', 30_000);
    const [first, second] = await Promise.all(bulk.map((c) => findNodeCommand(db, c.id)));
    expect(first!.completedAt!.getTime()).toBeLessThanOrEqual(second!.deliveredAt!.getTime());
    expect(second!.result).toMatchObject({ level: 'quick', gpus: expect.any(Array) });
  });

  it('a simulated reboot answers, drops the session and comes back with a new epoch', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    const before = await db
      .selectFrom('nodes')
      .select('epoch')
      .where('id', '=', node.nodeId)
      .executeTakeFirstOrThrow();
    const input = { nodeId: node.nodeId, kind: 'node.reboot', payload: { reason: 'kernel update' } };
    const reboot = await db.transaction().execute((trx) => enqueueNodeCommand(trx, input));
    await eventually(async () => (await findNodeCommand(db, reboot.id))?.state === 'succeeded');
    await eventually(async () => {
      const n = await db
        .selectFrom('nodes')
        .select(['epoch', 'connectivity'])
        .where('id', '=', node.nodeId)
        .executeTakeFirst();
      return n?.connectivity === 'connected' && Number(n.epoch) > Number(before.epoch);
    });
  });

  it('bcd status shows the node, its session, its certificate expiry and what it holds', async () => {
    const node = fx.fleet.nodes[0]!;
    const roots = { dir: node.dir, cdiDir: `${node.dir}/cdi`, envDir: `${node.dir}/allocations` };
    // The reboot test before this one waits for the gateway's side of the new session; bcd
    // writes its status file when its side has the Welcome, a moment later.
    await eventually(async () => readDaemonStatus(roots).session?.connected === true);
    const status = readDaemonStatus(roots);
    expect(status).toMatchObject({
      joined: true,
      nodeId: node.nodeId,
      holds: [],
      session: { connected: true },
    });
    expect(status.certificateExpiresInSeconds).toBeGreaterThan(23 * 3600);
    const printed = execFileSync(
      process.execPath,
      [
        'bin/bcd.js',
        'status',
        '--dir',
        roots.dir,
        '--cdi-dir',
        roots.cdiDir,
        '--env-dir',
        roots.envDir,
        '--json',
      ],
      { encoding: 'utf8' },
    );
    expect(JSON.parse(printed)).toMatchObject({ joined: true, nodeId: node.nodeId });
    const text = execFileSync(process.execPath, ['bin/bcd.js', 'status', '--dir', `${fx.dir}/nobody`], {
      encoding: 'utf8',
    });
    expect(text).toContain('not joined');
  });
});
