import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StartedSiteAgent } from '../../daemon/site-agent.ts';
import { eventually } from '../support/eventually.ts';
import { testLogger } from '../support/logger.ts';
import { useTempDir } from '../support/temp-dir.ts';
import { type MetalDeployHarness, startMetalDeployHarness } from './harness.ts';

/**
 * The site agent fails over in the middle of a deploy: the boot server is killed while the deploy
 * workflow is about to wait on a BMC step; that step's command, queued for the dead holder, fails
 * as superseded when the standby takes `site:<id>:boot` under a new epoch (only after the lease
 * expired), the step is sent again to the new holder, and the deploy finishes. No BMC command
 * ever reached a BMC twice. Nothing faked: the Redfish emulator, the gateway, Temporal.
 */
describe('a site agent failover during a deploy', () => {
  const dir = useTempDir('bc-metal-failover-');
  const log = testLogger('metal-failover');
  let h: MetalDeployHarness;
  let standby: StartedSiteAgent;

  beforeAll(async () => {
    h = await startMetalDeployHarness({ dir, log, machines: 1, name: 'failover' });
    standby = await h.site.startAgent('failover-standby');
    await eventually(
      async () =>
        (await h.call('nodes/get', { nodeId: standby.identity.nodeId })).connectivity === 'connected',
      60_000,
    );
    await eventually(
      async () => (await h.call('nodes/get', { nodeId: h.site.machines[0] })).provisionState === 'ready',
      300_000,
    );
  }, 600_000);

  afterAll(async () => {
    await h?.stop();
  });

  it('the standby takes over under a new epoch while the deploy waits on a BMC step; the deploy finishes; no BMC command ran twice', async () => {
    const db = h.api.database.db;
    const node = h.site.machines[0]!;
    const [holder] = h.site.agents as [StartedSiteAgent];
    const before = (await h.call('sites/get', { siteId: h.site.siteId })).bootLease;
    expect(before).toMatchObject({ holderNodeId: holder.identity.nodeId });
    const profileId = await h.signedProfile('failover', { acceptance: ['gpus-present'], maxAttempts: 2 });

    // The image answer is held, so the workflow is in write-image (a ramdisk step) when the boot
    // server dies: the next step, boot-disk, is a BMC step queued for a holder that is gone.
    const release = h.image.stall();
    const requestsBefore = h.image.requests;
    const started = await h.call('metal/deploy', { nodeId: node, profileId, idempotencyKey: 'failover' });
    await eventually(async () => h.image.requests > requestsBefore, 240_000);
    const streaming = await h.workflow(started.id);
    expect(streaming.steps.find((s: any) => s.name === 'write-image').state).toBe('running');
    await holder.stop();
    release();

    // The workflow waits on boot-disk: its command is queued for the old holder, whose lease runs on.
    const waiting = await h.until(
      started.id,
      (wf) => wf.steps.find((s: any) => s.name === 'boot-disk').attempts.length > 0,
      120_000,
    );
    const firstAttempt = waiting.steps.find((s: any) => s.name === 'boot-disk').attempts[0];
    const queued = await db
      .selectFrom('node_commands')
      .where('id', '=', firstAttempt.commandId)
      .select(['node_id', 'kind'])
      .executeTakeFirstOrThrow();
    expect(queued).toEqual({ node_id: holder.identity.nodeId, kind: 'bmc.boot' });

    // The standby takes the lease only once it expired, under the next epoch.
    await eventually(
      async () =>
        (await h.call('sites/get', { siteId: h.site.siteId })).bootLease?.holderNodeId ===
        standby.identity.nodeId,
      60_000,
    );
    const after = (await h.call('sites/get', { siteId: h.site.siteId })).bootLease;
    expect(after.epoch).toBe(before.epoch + 1);
    expect(after.acquiredAt).toBeGreaterThanOrEqual(before.expiresAt);

    const done = await h.until(started.id, (wf) => wf.state !== 'running', 300_000);
    expect(done.state, JSON.stringify(done.steps)).toBe('succeeded');
    expect(await h.call('nodes/get', { nodeId: node })).toMatchObject({
      provisionState: 'deployed',
      maintenance: false,
    });
    expect(h.machines.running(h.systems[0]!.uuid)).toBe('os');

    // boot-disk: the attempt queued for the dead holder failed as superseded without being
    // delivered, the second ran on the standby under the new epoch.
    const bootDisk = done.steps.find((s: any) => s.name === 'boot-disk');
    expect(bootDisk.attempts.map((a: any) => a.state)).toEqual(['failed', 'succeeded']);
    expect(bootDisk.attempts[0].error).toMatch(/superseded: the boot lease of site .* moved to epoch/);

    // Every BMC command of this deploy: those that reached a site agent, one per site step.
    const commands = await db
      .selectFrom('node_commands')
      .where('kind', 'like', 'bmc.%')
      .where(sql`payload->>'machineNodeId'`, '=', node)
      .where('created_at', '>=', new Date(done.createdAt))
      .select([
        'id',
        'node_id',
        'kind',
        'state',
        'delivered_at',
        sql<string>`payload->>'leaseEpoch'`.as('lease_epoch'),
      ])
      .orderBy('seq')
      .execute();
    const delivered = commands.filter((c) => c.delivered_at !== null);
    const siteSteps = done.steps.filter((s: any) => s.phase === 'main' && s.target === 'site');
    expect(delivered.length).toBe(siteSteps.length);
    expect(delivered.every((c) => c.state === 'succeeded')).toBe(true);
    const superseded = commands.filter((c) => c.delivered_at === null);
    expect(superseded.map((c) => [c.node_id, c.kind, c.state])).toEqual([
      [holder.identity.nodeId, 'bmc.boot', 'failed'],
    ]);
    // Before the failover on the old holder under the old epoch, after it on the standby under the new one.
    for (const c of delivered) {
      expect([c.node_id, Number(c.lease_epoch)]).toEqual(
        c.node_id === holder.identity.nodeId
          ? [holder.identity.nodeId, before.epoch]
          : [standby.identity.nodeId, after.epoch],
      );
    }
    expect(delivered.filter((c) => c.node_id === standby.identity.nodeId).map((c) => c.kind)).toEqual([
      'bmc.boot',
      'bmc.power',
    ]);
    // Each step's successful attempt names a distinct command: none was run for two attempts.
    const succeededCommands = done.steps
      .flatMap((s: any) => s.attempts)
      .filter((a: any) => a.state === 'succeeded' && a.commandId)
      .map((a: any) => a.commandId);
    expect(new Set(succeededCommands).size).toBe(succeededCommands.length);
  }, 600_000);
});
