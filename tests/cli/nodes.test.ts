import { beforeAll, describe, expect, test, vi } from 'vitest';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { useTestApi } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';
import { json, runCli } from './run-cli.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let asRoot: Record<string, string>;
let asAcme: Record<string, string>;
let poolId: string;
let nodes: RegisteredNode[];
beforeAll(async () => {
  asRoot = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.root.token };
  asAcme = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  ({ poolId, nodes } = await seedPool(api.database.db, {
    site: 'site-nodes',
    ownerTenantId: api.root.tenantId,
    nodes: 2,
    namePrefix: 'n',
    offers: { acme: { gpu: 8 } },
  }));
});

describe('nodes', () => {
  test('list, get, cordon, drain and uncordon; refusals', async () => {
    const node = nodes[0]!;
    const [table, listed, got] = await Promise.all([
      runCli(['nodes', 'list', '--pool', poolId], asRoot),
      runCli(['nodes', 'list', '--json'], asRoot),
      runCli(['nodes', 'get', node.id], asRoot),
    ]);
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+NAME\s+POOL\s+GPUS\s+ACCEPTS\s+WHY NOT\s+HEARTBEAT$/);
    expect(
      json(listed)
        .nodes.map((n: { id: string }) => n.id)
        .sort(),
    ).toEqual(nodes.map((n) => n.id).sort());
    expect(got.stdout).toMatch(new RegExp(`^id:\\s+${node.id}$`, 'm'));
    expect(got.stdout).toMatch(/^devices:$/m);

    const cordoned = json(
      await runCli(['nodes', 'cordon', node.id, '--reason', 'bad fan', '--json'], asRoot),
    );
    expect(cordoned.node).toMatchObject({ cordoned: true, cordonReason: 'bad fan' });
    const drained = await runCli(['nodes', 'drain', node.id], asRoot);
    // Nothing runs on it, so the drain finishes at once.
    expect(drained.stdout.trim()).toMatch(
      /: drained, Draining: DrainRequested; 0 live allocation\(s\), 0 calendar booking\(s\)$/,
    );
    const uncordoned = await runCli(['nodes', 'uncordon', node.id], asRoot);
    expect(uncordoned.stdout.trim()).toMatch(
      /: accepts work; 0 live allocation\(s\), 0 calendar booking\(s\)$/,
    );

    const [missing, denied] = await Promise.all([
      runCli(['nodes', 'get', newId('node')], asRoot),
      runCli(['nodes', 'cordon', node.id], asAcme),
    ]);
    expect(missing.code).toBe(3);
    expect(missing.stderr).toMatch(/^better-compute: NOT_FOUND: /);
    expect(denied.code).toBe(3);
    expect(denied.stderr).toMatch(/(ACCESS_DENIED|NOT_FOUND): /);
  });

  test('join-tokens create, list and revoke', async () => {
    const created = json(
      await runCli(
        ['join-tokens', 'create', '--pool', poolId, '--ttl', '2h', '--max-uses', '3', '--json'],
        asRoot,
      ),
    );
    expect(created).toMatchObject({ poolId, maxUses: 3, uses: 0, state: 'active' });
    expect(created.expiresAt - created.createdAt).toBe(2 * 3_600_000);
    expect(typeof created.token).toBe('string');
    const [listed, badTtl, revoked] = await Promise.all([
      runCli(['join-tokens', 'list', '--pool', poolId], asRoot),
      runCli(['join-tokens', 'create', '--pool', poolId, '--ttl', 'soon'], asRoot),
      runCli(['join-tokens', 'revoke', created.id], asRoot),
    ]);
    expect(listed.stdout).toMatch(new RegExp(`${created.id}\\s+${poolId}\\s+(active|revoked)\\s+0/3`));
    expect(badTtl.code).toBe(2);
    expect(revoked.stdout.trim()).toBe(`revoked ${created.id}`);
  });
  test('approve-reclaim, revoke-certificates and retire; refusals', async () => {
    const node = nodes[1]!;
    const db = api.database.db;
    // A node as a join leaves it: a hardware key and a certificate.
    await db
      .updateTable('nodes')
      .set({ hardware_key: `hk-${node.id}` })
      .where('id', '=', node.id)
      .execute();
    await db
      .insertInto('node_certificates')
      .values({
        serial: `serial-${node.id}`,
        node_id: node.id,
        role: 'node',
        spiffe_id: `spiffe://better-compute.local/node/${node.id}`,
        key_id: `key-${node.id}`,
        public_key_pem: 'unused',
        certificate_pem: 'unused',
        not_before: new Date(),
        not_after: new Date(Date.now() + 3_600_000),
      })
      .execute();
    const approved = await runCli(['nodes', 'approve-reclaim', node.id, '--ttl', '2h'], asRoot);
    expect(approved.stdout.trim()).toMatch(/: may be reclaimed until /);
    const revoked = json(
      await runCli(['nodes', 'revoke-certificates', node.id, '--reason', 'lost', '--json'], asRoot),
    );
    expect(revoked).toMatchObject({ revokedCertificates: 1, node: { id: node.id } });
    const denied = await runCli(['nodes', 'retire', node.id, '--force'], asAcme);
    expect(denied.code).toBe(3);
    expect(denied.stderr).toMatch(/(ACCESS_DENIED|NOT_FOUND): /);
    const retired = await runCli(['nodes', 'retire', node.id, '--reason', 'end of life'], asRoot);
    expect(retired.stdout.trim()).toMatch(/: retired; 0 certificate\(s\) revoked; 0 live allocation\(s\)$/);
    const again = await runCli(['nodes', 'retire', node.id], asRoot);
    expect(again.stdout.trim()).toMatch(/: already retired; /);
    const late = await runCli(['nodes', 'approve-reclaim', node.id], asRoot);
    expect(late.code).not.toBe(0);
    expect(late.stderr).toMatch(/^better-compute: INVALID_STATE: /);
    const row = await db
      .selectFrom('nodes')
      .select(['provision_state', 'hardware_key', 'cordon_reason'])
      .where('id', '=', node.id)
      .executeTakeFirstOrThrow();
    expect(row).toEqual({ provision_state: 'retired', hardware_key: null, cordon_reason: 'end of life' });
  });
});
