import { spawn } from 'node:child_process';
import path from 'node:path';
import { beforeAll, describe, expect, test, vi } from 'vitest';
import { createComputeClient } from '../../client/index.ts';
import { h100Shape } from '../../db/nodes/fleet.ts';
import { useTestApi } from '../support/api.ts';
import { insertOutboxEvent } from '../support/events.ts';
import { seedPool } from '../support/fleet.ts';
import { json, runCli } from './run-cli.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let env: Record<string, string>;
let poolId: string;
beforeAll(async () => {
  env = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  const db = api.database.db;
  const offers = { acme: { gpu: 8 } };
  const pool = await seedPool(db, {
    site: 'site-cli',
    ownerTenantId: api.root.tenantId,
    nodes: 2,
    namePrefix: 'cli',
    offers,
  });
  poolId = pool.poolId;
  // A second pool with one node that never reported host resources nor a heartbeat, cordoned.
  const [bare] = (
    await seedPool(db, {
      siteId: pool.siteId,
      ownerTenantId: api.root.tenantId,
      name: 'bare',
      nodes: 1,
      namePrefix: 'zz-bare',
      shape: { ...h100Shape, resources: {} },
      offers,
    })
  ).nodes;
  await db
    .updateTable('nodes')
    .set({ last_heartbeat_at: null, cordoned: true, cordon_reason: 'fan' })
    .where('id', '=', bare!.id)
    .execute();
});

const reserveArgs = () => [
  'reserve',
  '--tenant',
  'acme',
  '--pool',
  poolId,
  '--gpus',
  '4',
  '--for',
  '8h',
  '--nvlink',
];

describe('capacity', () => {
  test('per pool, and a preview that takes the flags of reserve', async () => {
    const [table, asJson, preview, previewTable, tooBig] = await Promise.all([
      runCli(['capacity', '--tenant', 'acme'], env),
      runCli(['capacity', '--tenant', 'acme', '--pool', poolId, '--json'], env),
      runCli(
        [
          'capacity',
          '--tenant',
          'acme',
          '--preview',
          '--pool',
          poolId,
          '--gpus',
          '4',
          '--for',
          '8h',
          '--nvlink',
          '--json',
        ],
        env,
      ),
      runCli(['capacity', '--preview', '--pool', poolId, '--gpus', '2', '--for', '1h'], env),
      runCli(['capacity', '--preview', '--pool', poolId, '--gpus', '9', '--for', '1h', '--json'], env),
    ]);
    expect(table.stdout.split('\n')[0]).toMatch(
      /^POOL\s+NAME\s+MODEL\s+REGION\s+NODES\s+ALLOCATABLE\s+ALLOCATED\s+RESERVED\s+AVAILABLE\s+QUOTA$/,
    );
    expect(table.stdout).toMatch(/h100\s+h100\s+eu-central-1\s+2\/2\s+16\s+0\s+0\s+16\s+0\/8/);
    expect(json(asJson).pools).toEqual([
      expect.objectContaining({ poolId, allocatable: 16, available: 16, quota: { limit: 8, used: 0 } }),
    ]);
    const p = json(preview);
    expect(p.fits).toBe(true);
    expect(p.deviceIds).toHaveLength(4);
    expect(previewTable.stdout).toMatch(/^fits:\s+yes$/m);
    expect(json(tooBig).fits).toBe(false);
  });
});

describe('capacity nodes', () => {
  test('one row per node, net of live bookings; what a node never reported is not reported, never zero', async () => {
    const client = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const r = await client.reservations.create({
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 3 }],
      resources: { vcpu: 40, memoryGiB: 300 },
      duration: '1h',
      idempotencyKey: 'nodes-view',
    });
    const node = r.allocations[0]!.nodeId;
    const [table, asJson, onePool] = await Promise.all([
      runCli(['capacity', 'nodes'], env),
      runCli(['capacity', 'nodes', '--json'], env),
      runCli(['capacity', 'nodes', '--pool', 'bare', '--json'], env),
    ]);
    await client.reservations.release({ tenantId: 'acme', reservationId: r.id });
    const rows = json(asJson).nodes as Array<Record<string, any>>;
    expect(rows).toHaveLength(3);
    const booked = rows.find((n) => n.nodeId === node)!;
    expect(booked).toMatchObject({
      acceptsWork: true,
      refusals: [],
      gpus: { total: 8, free: 5, reserved: 0 },
      // The request is raised to the pool's per-GPU host share: 3 × 24 vCPUs, 3 × 256 GiB.
      vcpu: { total: 192, free: 120 },
      memoryGiB: { total: 2048, free: 1280 },
    });
    const bare = rows.find((n) => n.name.startsWith('zz-bare'))!;
    expect(bare).toMatchObject({
      acceptsWork: false,
      refusals: ['cordoned (fan)'],
      gpus: { total: 8, free: 8 },
      vcpu: { total: null, free: null, reserved: null },
      memoryGiB: { total: null, free: null, reserved: null },
      lastHeartbeatAt: null,
      heartbeatAgeSeconds: null,
    });
    expect(json(onePool).nodes.map((n: { nodeId: string }) => n.nodeId)).toEqual([bare.nodeId]);
    expect(table.stdout.split('\n')[0]).toMatch(
      /^NODE\s+ACCEPTS\s+GPUS\s+VCPUS\s+MEMORY GIB\s+RESERVED\s+WHY NOT\s+CALENDAR\s+HEARTBEAT$/,
    );
    expect(table.stdout).toMatch(
      /zz-bare-00000\s+no\s+8\/8\s+not reported\s+not reported\s+0 GPU\s+cordoned \(fan\)\s+-\s+not reported/,
    );
    expect(table.stdout).toMatch(/\s+yes\s+5\/8\s+120\/192\s+1280\/2048\s+0 GPU\s+/);
  });
});

describe('reserve and the lifecycle commands', () => {
  test('reserve prints a new key unless --key is given; the same key retries the same reservation', async () => {
    const fresh = await runCli(reserveArgs(), env);
    expect(fresh.code).toBe(0);
    const key = /idempotency key: (cli-\S+)/.exec(fresh.stderr)?.[1];
    expect(key).toBeDefined();
    expect(fresh.stdout).toMatch(/^state:\s+placed$/m);
    const retried = json(await runCli([...reserveArgs(), '--key', key!, '--json'], env));
    expect(retried.idempotencyKey).toBe(key);
    expect(fresh.stdout).toContain(retried.id);
    // The same key with a different request is a conflict that names the reservation.
    const conflict = await runCli([...reserveArgs().slice(0, -1), '--key', key!], env);
    expect(conflict.code).toBe(3);
    expect(conflict.stderr).toMatch(/^better-compute: CONFLICT: .*Next: run it again with a new --key/);
    await runCli(['release', retried.id, '--tenant', 'acme'], env);
  });

  test('refusals and bad input: quota, unknown pool, malformed duration and date', async () => {
    const [quota, unknownPool, badDuration, badStart, missing] = await Promise.all([
      runCli(['reserve', '--tenant', 'acme', '--pool', poolId, '--gpus', '12', '--for', '1h'], env),
      runCli(['reserve', '--tenant', 'acme', '--pool', 'pool_missing', '--gpus', '1', '--for', '1h'], env),
      runCli(['reserve', '--pool', poolId, '--gpus', '1', '--for', 'eight hours'], env),
      runCli(['reserve', '--pool', poolId, '--gpus', '1', '--for', '1h', '--start', 'tomorrow-ish'], env),
      runCli(['reserve', '--pool', poolId, '--for', '1h'], env),
    ]);
    expect(quota.code).toBe(3);
    expect(quota.stderr).toMatch(/QUOTA_EXCEEDED: .*Next: ask for fewer resources/);
    expect(unknownPool.code).toBe(3);
    expect(unknownPool.stderr).toMatch(/NOT_FOUND/);
    expect(badDuration.code).toBe(2);
    expect(badDuration.stderr).toMatch(/'--for <duration>' argument 'eight hours' is invalid/);
    expect(badStart.code).toBe(2);
    expect(badStart.stderr).toMatch(/expected a date such as 2026-12-01T09:00:00Z/);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/'--gpus <n>' not specified/);
  });

  test('extend, get --query, list, renew, cancel and release', async () => {
    const created = json(await runCli([...reserveArgs(), '--key', 'walk-1', '--json'], env));
    const id: string = created.id;
    const end0: number = created.during.end;

    const extended = json(await runCli(['extend', id, '--tenant', 'acme', '--by', '4h', '--json'], env));
    expect(extended.extended).toBe(true);
    expect(extended.reservation.during.end).toBe(end0 + 4 * 3_600_000);
    const [earlier, both, queryEnd, queryBinding, queryMissing, listed, renew] = await Promise.all([
      runCli(['extend', id, '--until', '+1h'], env),
      runCli(['extend', id, '--until', '+1h', '--by', '1h'], env),
      runCli(['reservations', 'get', id, '--tenant', 'acme', '--query', 'during.end'], env),
      runCli(['reservations', 'get', id, '--query', 'binding'], env),
      runCli(['reservations', 'get', id, '--query', 'nope.nothing'], env),
      runCli(['reservations', 'list', '--tenant', 'acme', '--json'], env),
      runCli(['renew', id], env),
    ]);
    expect(earlier.code).toBe(0);
    expect(earlier.stdout).toMatch(/^not extended: /);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/exactly one of --until .* or --by/);
    expect(queryEnd.stdout.trim()).toBe(String(end0 + 4 * 3_600_000));
    expect(queryBinding.stdout.trim()).toBe('null');
    expect(queryMissing.code).toBe(2);
    expect(json(listed).reservations.map((r: { id: string }) => r.id)).toContain(id);
    expect(renew.code).toBe(3);
    expect(renew.stderr).toMatch(/INVALID_STATE: .*without leaseSeconds/);

    const cancelled = await runCli(['cancel', id], env);
    expect(cancelled.stdout.trim()).toMatch(new RegExp(`^${id} is cancelled`));
    const [again, table] = await Promise.all([
      runCli(['cancel', id, '--json'], env),
      runCli(['reservations', 'list', '--state', 'cancelled'], env),
    ]);
    expect(again.code).toBe(3);
    expect(JSON.parse(again.stdout).error.code).toBe('INVALID_STATE');
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+STATE\s+POOL\s+DEVICES\s+START\s+END\s+CONDITIONS$/);
    expect(table.stdout).toMatch(new RegExp(`${id}\\s+cancelled`));
  });

  test('a pool by name, --query on reserve, and watch --until a state already reached', async () => {
    const id = await runCli(
      [
        'reserve',
        '--pool',
        'h100',
        '--gpus',
        '1',
        '--for',
        '1h',
        '--lease',
        '600',
        '--key',
        'by-name',
        '--query',
        'id',
      ],
      env,
    );
    expect(id.code).toBe(0);
    expect(id.stdout.trim()).toMatch(/^rsv_[a-z2-7]+$/);
    const [unknown, watched, renewed] = await Promise.all([
      runCli(['reserve', '--pool', 'a100', '--gpus', '1', '--for', '1h'], env),
      runCli(['reservations', 'watch', id.stdout.trim(), '--until', 'placed', '--timeout', '20s'], env),
      runCli(['renew', id.stdout.trim(), '--json'], env),
    ]);
    // A reservation made with a lease renews: the deadline moves to now + 600 s.
    expect(json(renewed).lease).toMatchObject({ seconds: 600, expiresAt: expect.any(Number) });
    expect(json(renewed).lease.expiresAt).toBeGreaterThan(Date.now() + 590_000);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(
      /--pool: tenant acme is offered no pool named a100; its pools: bare \(pool_\w+\), h100 \(pool_/,
    );
    expect(watched.code).toBe(0);
    expect(watched.stdout.trim()).toBe(`${id.stdout.trim()} is placed`);
    await runCli(['release', id.stdout.trim()], env);
  });

  test('delegated confirmation: the agent is held, the person approves from the CLI, the same key places', async () => {
    const person = await api.iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'dora' });
    await api.iam.admin.bindRole({ identityId: person.id, role: 'member' });
    const agent = await api.iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'agent',
      name: 'doras-agent',
      personIdentityId: person.id,
      confirmActions: ['compute:reservations:create'],
    });
    await api.iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    const asAgent = {
      BETTER_COMPUTE_URL: api.url,
      BETTER_COMPUTE_TOKEN: (await api.iam.admin.createToken({ identityId: agent.id })).token,
    };
    const asPerson = {
      BETTER_COMPUTE_URL: api.url,
      BETTER_COMPUTE_TOKEN: (await api.iam.admin.createToken({ identityId: person.id })).token,
    };
    const args = ['reserve', '--pool', poolId, '--gpus', '1', '--for', '1h', '--key', 'agent-run-1'];

    const held = await runCli(args, asAgent);
    expect(held.code).toBe(3);
    expect(held.stderr).toMatch(
      /CONFIRMATION_REQUIRED: .*Next: the person you act for must approve it \(`confirmations approve ID`\); then retry with the same --key/,
    );
    const listed = json(await runCli(['confirmations', 'list', '--json'], asPerson));
    expect(listed.confirmations).toHaveLength(1);
    const confirmation = listed.confirmations[0];
    expect(confirmation).toMatchObject({ state: 'pending', action: 'compute:reservations:create' });
    const approved = await runCli(['confirmations', 'approve', confirmation.id], asPerson);
    expect(approved.stdout.trim()).toMatch(
      new RegExp(`^${confirmation.id} approved: compute:reservations:create on rsv_`),
    );
    const placed = json(await runCli([...args, '--json'], asAgent));
    expect(placed.state).toBe('placed');
    await runCli(['release', placed.id], asAgent);
  });

  test('reservations watch follows the events live and ends with the reservation', async () => {
    const client = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const r = await client.reservations.create({
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'watch-1',
    });
    const child = spawn(
      process.execPath,
      [
        path.resolve(import.meta.dirname, '../../bin/better-compute.js'),
        'reservations',
        'watch',
        r.id,
        '--json',
      ],
      { env: { PATH: process.env.PATH, ...env, BETTER_COMPUTE_DATA_DIR: '/nonexistent' } },
    );
    let stdout = '';
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    // It follows live once an event written now comes out on the stream (before that, a release
    // could be read as its state instead): write a marker until one does, then release.
    const deadline = Date.now() + 60_000;
    while (!stdout.includes('"type":"test.watching"') && Date.now() < deadline) {
      await insertOutboxEvent(api.database.db, {
        type: 'test.watching',
        subject: `reservation/${r.id}`,
        tenantId: 'acme',
      });
      const waitUntil = Date.now() + 1_500;
      while (!stdout.includes('"type":"test.watching"') && Date.now() < waitUntil)
        await new Promise((x) => setTimeout(x, 50));
    }
    await client.reservations.release({ tenantId: 'acme', reservationId: r.id });
    const code = await exited;
    expect(code).toBe(0);
    const lines = stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines[0]).toMatchObject({ kind: 'state', state: 'placed' });
    expect(lines.at(-1)).toMatchObject({
      kind: 'event',
      type: 'reservation.released',
      subject: `reservation/${r.id}`,
    });
  });
});
