import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MetalMachines } from '../../daemon/metal-machines.ts';
import type { EmulatedSystem } from '../../daemon/redfish-emulator.ts';
import { signImage } from '../../domain/metal-images.ts';
import { generateReleaseSigningKey } from '../../domain/release-manifest.ts';
import { createCompute } from '../../server/compute.ts';
import { startWatchdog } from '../../server/supervise.ts';
import { type ApiFixture, callApi } from '../support/api.ts';
import { eventually } from '../support/eventually.ts';
import { testLogger } from '../support/logger.ts';
import type { MetalSite } from '../support/metal-site.ts';
import { PlaneChild } from '../support/plane-children.ts';
import { useTempDir } from '../support/temp-dir.ts';
import type { TestTemporal } from '../support/temporal.ts';
import { type MetalDeployHarness, startMetalDeployHarness } from './harness.ts';

/**
 * Provisioning workflows end to end, nothing faked: the API, PostgreSQL, the Temporal dev server
 * with a worker, the gateway with mutual TLS, a site agent driving the Redfish emulator of
 * sushy-tools, and simulated machines that follow the emulator's power and boot device (its
 * change notifications): enrolment inspects each machine over its ramdisk (discovery attestor),
 * a signed image is deployed and the deployed system joins as the node; a digest mismatch, a
 * failed step retried, an abort while waiting for a rejoin, and the provision-state table.
 */
describe('bare-metal provisioning workflows over the Redfish emulator', () => {
  const dir = useTempDir('bc-metal-deploy-');
  const log = testLogger('metal-deploy');
  let h: MetalDeployHarness;
  let signer: MetalDeployHarness['signer'];
  let imageSha: string;
  let imageBase: string;
  let api: ApiFixture;
  let temporal: TestTemporal;
  let site: MetalSite;
  let machines: MetalMachines;
  let systems: EmulatedSystem[];
  let signedImageId: string;
  let profileId: string;

  const answer = (p: string, body: unknown) => h.answer(p, body);
  const call = (p: string, body: unknown) => h.call(p, body);
  const workflow = (workflowId: string) => h.workflow(workflowId);
  const until = (workflowId: string, test: (wf: any) => boolean, ms = 240_000) =>
    h.until(workflowId, test, ms);

  beforeAll(async () => {
    h = await startMetalDeployHarness({ dir, log, machines: 4, name: 'rack' });
    ({ signer, api, temporal, site, machines, systems } = h);
    imageSha = h.image.sha256;
    imageBase = h.image.base;
  }, 600_000);

  afterAll(async () => {
    await h?.stop();
  });

  it('enrolment inspects every machine over its ramdisk (discovery attestor): ready, with its hardware key and GPUs', async () => {
    const db = api.database.db;
    await eventually(async () => {
      const rows = await db
        .selectFrom('nodes')
        .where('id', 'in', site.machines)
        .select('provision_state')
        .execute();
      return rows.every((r) => r.provision_state === 'ready');
    }, 300_000);
    const nodes = await db
      .selectFrom('nodes')
      .where('id', 'in', site.machines)
      .select(['id', 'hardware_key', 'maintenance'])
      .execute();
    expect(nodes.every((n) => n.hardware_key !== null && !n.maintenance)).toBe(true);
    const gpus = await db
      .selectFrom('devices')
      .where('node_id', 'in', site.machines)
      .where('class', '=', 'gpu')
      .select('node_id')
      .execute();
    expect(gpus.length).toBe(2 * site.machines.length);
    // Each ramdisk joined with the discovery attestor: a certificate of role ramdisk, at most 2 hours.
    const certs = await db
      .selectFrom('node_certificates')
      .where('node_id', 'in', site.machines)
      .where('role', '=', 'ramdisk')
      .select(['not_before', 'not_after', 'created_at'])
      .execute();
    expect(certs.length).toBeGreaterThanOrEqual(site.machines.length);
    for (const c of certs)
      expect(c.not_after.getTime() - c.created_at.getTime()).toBeLessThanOrEqual(2 * 3_600_000);
    const listed = await call('workflows/list', { state: 'succeeded' });
    expect(listed.workflows.filter((w: any) => w.kind === 'inspect').length).toBe(site.machines.length);
    // Every inspected machine is powered off again.
    for (const system of systems) expect(machines.running(system.uuid)).toBeNull();
  }, 320_000);

  it('images: a signed one is verified (public), an unsigned one private; a bad signature is refused; profiles are versioned', async () => {
    const identity = { name: 'ubuntu', version: '24.04', format: 'raw' as const, sha256: imageSha };
    const signed = await call('images/register', {
      ...identity,
      url: `${imageBase}/images/ubuntu.raw`,
      signature: signImage(identity, signer.privateKeyPem),
    });
    expect(signed).toMatchObject({ verified: true, visibility: 'public', signerPin: signer.pin });
    signedImageId = signed.id;
    const other = generateReleaseSigningKey();
    const unpinned = await call('images/register', {
      ...identity,
      version: '24.04-unpinned',
      url: `${imageBase}/images/ubuntu.raw`,
      signature: signImage({ ...identity, version: '24.04-unpinned' }, other.privateKeyPem),
    });
    expect(unpinned).toMatchObject({ verified: false, visibility: 'private' });
    const forged = await answer('images/register', {
      ...identity,
      version: '24.04-forged',
      url: `${imageBase}/images/ubuntu.raw`,
      signature: signImage(identity, signer.privateKeyPem),
    });
    expect(forged.status).toBe(400);
    expect(forged.body.error.message).toMatch(/does not verify over ubuntu@24.04-forged/);
    const again = await answer('images/register', {
      ...identity,
      sha256: 'b'.repeat(64),
      url: `${imageBase}/x`,
    });
    expect(again.body.error.code).toBe('CONFLICT');
    const v1 = await call('profiles/create', {
      name: 'gpu-node',
      spec: {
        imageId: signedImageId,
        acceptance: ['inventory-reported', 'gpus-present', 'gpus-healthy'],
        stepTimeoutSeconds: 120,
        maxAttempts: 2,
      },
    });
    const v2 = await call('profiles/create', {
      name: 'gpu-node',
      spec: { imageId: signedImageId, userData: '#cloud-config\n', stepTimeoutSeconds: 120, maxAttempts: 1 },
    });
    expect([v1.version, v2.version, v2.id]).toEqual([1, 2, v1.id]);
    profileId = v1.id;
  });

  it('an illegal move is INVALID_STATE naming the current state; maintenance keeps a node out and blocks a deploy', async () => {
    const [node] = site.machines;
    const db = api.database.db;
    await db.updateTable('nodes').set({ provision_state: 'enrolling' }).where('id', '=', node!).execute();
    const refused = await answer('metal/deploy', { nodeId: node, profileId, idempotencyKey: 'illegal' });
    expect(refused.body.error).toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringMatching(/is enrolling: metal.deploy needs it to become deploying/),
    });
    await db.updateTable('nodes').set({ provision_state: 'ready' }).where('id', '=', node!).execute();
    const set = await call('nodes/setMaintenance', { nodeId: node, reason: 'fan noise' });
    expect(set.node).toMatchObject({ maintenance: true, maintenanceReason: 'fan noise' });
    const blocked = await answer('metal/deploy', { nodeId: node, profileId, idempotencyKey: 'blocked' });
    expect(blocked.body.error.message).toMatch(/is in maintenance \(fan noise\)/);
    const cleared = await call('nodes/clearMaintenance', { nodeId: node });
    expect(cleared.node).toMatchObject({ maintenance: false, maintenanceReason: null });
    expect(
      await db
        .selectFrom('metal_workflows')
        .where('idempotency_key', 'in', ['illegal', 'blocked'])
        .selectAll()
        .execute(),
    ).toEqual([]);
  });

  it('deploys a signed image: every step through the site agent and the ramdisk, the deployed system joins as the node, deployed', async () => {
    const node = site.machines[0]!;
    const started = await call('metal/deploy', {
      nodeId: node,
      profileId,
      profileVersion: 1,
      idempotencyKey: 'first',
    });
    expect(started.state).toBe('running');
    expect(started.steps.map((s: any) => s.name)).toContain('write-image');
    const again = await call('metal/deploy', {
      nodeId: node,
      profileId,
      profileVersion: 1,
      idempotencyKey: 'first',
    });
    expect(again.id).toBe(started.id);
    const second = await answer('metal/deploy', { nodeId: node, profileId, idempotencyKey: 'second' });
    expect(second.body.error).toMatchObject({ code: 'CONFLICT' });
    const done = await until(started.id, (wf) => wf.state !== 'running');
    expect(done.state).toBe('succeeded');
    expect(done.steps.filter((s: any) => s.phase === 'main').every((s: any) => s.state === 'succeeded')).toBe(
      true,
    );
    const rejoin = done.steps.find((s: any) => s.name === 'reboot-into-image');
    expect(rejoin).toMatchObject({ awaitRejoin: 'node', target: 'site' });
    const got = await call('nodes/get', { nodeId: node });
    expect(got).toMatchObject({ provisionState: 'deployed', role: 'node', maintenance: false });
    expect(machines.running(systems[0]!.uuid)).toBe('os');
    expect(machines.disk(systems[0]!.uuid)?.image).toMatchObject({ name: 'ubuntu', sha256: imageSha });
    const profile = await call('profiles/get', { profileId, version: 1 });
    expect(profile.immutable).toBe(true);
    // Each step's command ran once: one attempt each.
    expect(done.steps.filter((s: any) => s.phase === 'main').every((s: any) => s.attempts.length === 1)).toBe(
      true,
    );
    // The gateway woke the workflow as each agent step's command was answered and as the machine's
    // agents joined again, rather than leaving every step to the workflow's next look. The last of
    // them may find the workflow already ended (its own look saw the same commit first).
    const history = await temporal.client.workflow.getHandle(started.id).fetchHistory();
    const wakes = (history.events ?? []).filter(
      (e) => e.workflowExecutionSignaledEventAttributes?.signalName === 'wake',
    ).length;
    const agentSteps = done.steps.filter((s: any) => s.phase === 'main' && s.target !== 'control-plane');
    const rejoins = agentSteps.filter((s: any) => s.awaitRejoin).length;
    expect(wakes).toBeGreaterThanOrEqual(agentSteps.length + rejoins - 1);
  }, 300_000);

  it('a digest mismatch fails the write step; the node is in maintenance with the reason; abort cleans up to ready', async () => {
    const node = site.machines[1]!;
    const wrong = await call('images/register', {
      name: 'ubuntu',
      version: '24.04-wrong-digest',
      format: 'raw',
      sha256: 'c'.repeat(64),
      url: `${imageBase}/images/ubuntu.raw`,
    });
    const profile = await call('profiles/create', {
      name: 'wrong-digest',
      spec: { imageId: wrong.id, stepTimeoutSeconds: 120, maxAttempts: 1 },
    });
    const started = await call('metal/deploy', {
      nodeId: node,
      profileId: profile.id,
      idempotencyKey: 'digest',
    });
    const failed = await until(started.id, (wf) => wf.state === 'failed');
    const step = failed.steps.find((s: any) => s.name === 'write-image');
    expect(step.state).toBe('failed');
    expect(step.error).toMatch(
      /digest mismatch: .* streamed sha256 [0-9a-f]{64}, the image ubuntu@24.04-wrong-digest is registered with c{64}/,
    );
    const inMaintenance = await call('nodes/get', { nodeId: node });
    expect(inMaintenance).toMatchObject({ provisionState: 'deploying', maintenance: true });
    expect(inMaintenance.maintenanceReason).toMatch(/failed at step write-image: digest mismatch/);
    // The operator cannot clear maintenance under a failed workflow: retry or abort decides.
    const clear = await answer('nodes/clearMaintenance', { nodeId: node });
    expect(clear.body.error.code).toBe('INVALID_STATE');
    await call('metal/abort', { workflowId: started.id, reason: 'bad image' });
    const aborted = await until(started.id, (wf) => wf.state === 'aborted');
    expect(
      aborted.steps.filter((s: any) => s.phase === 'cleanup').every((s: any) => s.state === 'succeeded'),
    ).toBe(true);
    const after = await call('nodes/get', { nodeId: node });
    expect(after).toMatchObject({ provisionState: 'ready', maintenance: true });
    expect(after.maintenanceReason).toMatch(/aborted: bad image/);
    expect(machines.running(systems[1]!.uuid)).toBeNull();
    await call('nodes/clearMaintenance', { nodeId: node });
  }, 300_000);

  it('a failed step is retried from where it failed (metal.retry), and the workflow then succeeds', async () => {
    const node = site.machines[2]!;
    h.image.failRequests = 1_000;
    const started = await call('metal/deploy', {
      nodeId: node,
      profileId,
      profileVersion: 2,
      idempotencyKey: 'retry',
    });
    const failed = await until(started.id, (wf) => wf.state === 'failed');
    const failedStep = failed.steps.find((s: any) => s.state === 'failed');
    expect(failedStep.name).toBe('write-image');
    expect(failedStep.error).toMatch(/HTTP 503/);
    const succeededBefore = failed.steps.filter((s: any) => s.state === 'succeeded').map((s: any) => s.name);
    h.image.failRequests = 0;
    const resumed = await call('metal/retry', { workflowId: started.id });
    expect(resumed.state).toBe('running');
    const done = await until(started.id, (wf) => wf.state !== 'running');
    expect(done.state).toBe('succeeded');
    const write = done.steps.find((s: any) => s.name === 'write-image');
    expect(write.attempts.map((a: any) => a.state)).toEqual(['failed', 'succeeded']);
    // The steps before it did not run again.
    for (const name of succeededBefore)
      expect(done.steps.find((s: any) => s.name === name).attempts.length).toBe(1);
    expect(await call('nodes/get', { nodeId: node })).toMatchObject({
      provisionState: 'deployed',
      maintenance: false,
    });
  }, 300_000);

  it('metal.abort stops at once while the workflow waits for the ramdisk to join, and the cleanup powers the machine off', async () => {
    const node = site.machines[3]!;
    machines.silentRamdisks.add(systems[3]!.uuid);
    const started = await call('metal/deploy', { nodeId: node, profileId, idempotencyKey: 'abort' });
    await until(
      started.id,
      (wf) =>
        wf.steps.find((s: any) => s.name === 'power-on-ramdisk')?.state === 'running' &&
        wf.steps.find((s: any) => s.name === 'power-on-ramdisk').attempts.at(-1)?.state === 'running',
    );
    // Wait until the power-on command itself is done: the workflow now waits for the rejoin only.
    await eventually(async () => {
      const wf = await workflow(started.id);
      const attempt = wf.steps.find((s: any) => s.name === 'power-on-ramdisk').attempts.at(-1);
      const command = await call('nodes/getCommand', {
        nodeId: site.agents[0]!.identity.nodeId,
        commandId: attempt.commandId,
      });
      return command.state === 'succeeded';
    }, 60_000);
    const before = Date.now();
    const aborting = await call('metal/abort', { workflowId: started.id, reason: 'changed my mind' });
    expect(aborting.phase).toBe('cleanup');
    expect(Date.now() - before).toBeLessThan(10_000);
    const aborted = await until(started.id, (wf) => wf.state === 'aborted');
    const waited = aborted.steps.find((s: any) => s.name === 'power-on-ramdisk');
    expect(waited).toMatchObject({ state: 'failed', error: 'aborted: changed my mind' });
    expect(aborted.steps.filter((s: any) => s.phase === 'main' && s.state === 'pending')).toEqual([]);
    expect(await call('nodes/get', { nodeId: node })).toMatchObject({
      provisionState: 'ready',
      maintenance: true,
    });
    const machine = await call('metal/getMachine', { nodeId: node });
    expect(machine.bmc.powerState).toBe('off');
    machines.silentRamdisks.delete(systems[3]!.uuid);
  }, 300_000);

  it('a worker SIGKILLed mid-deploy: a new one goes on from the same step, and no step’s command runs twice', async () => {
    const node = site.machines[0]!;
    const watchdog = startWatchdog();
    const taskQueue = `metal-kill-${Date.now()}`;
    const worker = new PlaneChild(
      {
        role: 'worker',
        databaseUrl: api.database.url,
        temporalAddress: temporal.address,
        taskQueue,
        timers: {},
        activityTimeoutMs: 5_000,
      },
      watchdog,
    );
    try {
      await worker.start();
      const killable = createCompute({
        ...api.deps,
        temporal: temporal.client,
        config: { ...api.deps.config, BETTER_COMPUTE_TASK_QUEUE: taskQueue },
      });
      const deployed = await callApi(killable.app, api.root.token, 'metal/deploy', {
        nodeId: node,
        profileId,
        profileVersion: 1,
        idempotencyKey: 'redeploy-kill',
      });
      expect(deployed.status, JSON.stringify(deployed.body)).toBe(200);
      const id = deployed.body.data.id as string;
      await until(id, (wf) => wf.steps.find((s: any) => s.name === 'wipe-disk')?.state !== 'pending');
      await worker.kill();
      await worker.start();
      const done = await until(id, (wf) => wf.state !== 'running');
      expect(done.state).toBe('succeeded');
      expect(done.steps.filter((s: any) => s.phase === 'main').map((s: any) => s.attempts.length)).toEqual(
        done.steps.filter((s: any) => s.phase === 'main').map(() => 1),
      );
      // Exactly one command per agent step of this workflow, on the site agent and on the machine.
      const since = new Date(done.createdAt);
      const commands = await api.database.db
        .selectFrom('node_commands')
        .where('created_at', '>=', since)
        .where((eb) =>
          eb.or([
            eb('node_id', '=', node),
            eb.and([eb('kind', 'like', 'bmc.%'), eb(sql`payload->>'machineNodeId'`, '=', node)]),
          ]),
        )
        .select('kind')
        .execute();
      const agentSteps = done.steps.filter((s: any) => s.phase === 'main' && s.target !== 'control-plane');
      expect(commands.length).toBe(agentSteps.length);
      expect(await call('nodes/get', { nodeId: node })).toMatchObject({ provisionState: 'deployed' });
    } finally {
      await worker.kill();
      await watchdog.stop();
    }
  }, 300_000);
});
