import { beforeAll, describe, expect, test, vi } from 'vitest';
import { setOperatorLabels } from '../../db/nodes/labels.ts';
import { json, runCli } from '../cli/run-cli.ts';
import { useTestApi } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

/** `reserve --gang N --topology-key K`, `capacity --preview --gang`, and a gang in `reservations get`. */
const api = useTestApi();
let env: Record<string, string>;
let poolId: string;

beforeAll(async () => {
  env = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  const pool = await seedPool(api.database.db, {
    site: 'site-gang-cli',
    ownerTenantId: api.root.tenantId,
    nodes: 5,
    namePrefix: 'gang',
    offers: { acme: { gpu: 64 } },
  });
  poolId = pool.poolId;
  // fabric-a: 2 nodes, fabric-b: 3 nodes.
  await setOperatorLabels(
    api.database.db,
    pool.nodes.map((n, i) => ({
      nodeId: n.id,
      key: 'fabric.domain',
      value: i < 2 ? 'fabric-a' : 'fabric-b',
    })),
  );
});

const gangArgs = (size: string) => [
  '--tenant',
  'acme',
  '--pool',
  poolId,
  '--gpus',
  '8',
  '--for',
  '1h',
  '--gang',
  size,
  '--topology-key',
  'fabric.domain',
];

describe('the CLI with gangs', () => {
  test('preview, reserve and get show the members readably and in --json', async () => {
    const preview = await runCli(['capacity', '--preview', ...gangArgs('3')], env);
    expect(preview.code).toBe(0);
    expect(preview.stdout).toMatch(/^topology value:\s+fabric-b$/m);
    expect(preview.stdout).toContain('gang members:');
    expect(preview.stdout).toMatch(/^ {2}fabric-a: 2 of 2 nodes fit; a gang of 3 needs 3$/m);
    expect(preview.stdout).toMatch(/^ {2}fabric-b: 3 of 3 nodes fit$/m);

    const reserved = json(await runCli(['reserve', ...gangArgs('3'), '--key', 'gang-cli', '--json'], env));
    expect(reserved.state).toBe('placed');
    expect(reserved.gang).toEqual({ size: 3, topologyKey: 'fabric.domain', topologyValue: 'fabric-b' });
    expect(reserved.allocations.map((a: { gangIndex: number }) => a.gangIndex)).toEqual([0, 1, 2]);

    const readable = await runCli(['reservations', 'get', reserved.id, '--tenant', 'acme'], env);
    expect(readable.code).toBe(0);
    expect(readable.stdout).toMatch(/^devices:\s+3 nodes × 8 × gpu$/m);
    expect(readable.stdout).toContain('gang: 3 nodes, fabric.domain=fabric-b');
    for (const i of [0, 1, 2])
      expect(readable.stdout).toMatch(new RegExp(`^  member ${i}  gang-\\d+ \\(node_`, 'm'));

    // No value has 3 free nodes left: the refusal names each value.
    const noFit = json(await runCli(['reserve', ...gangArgs('3'), '--key', 'gang-cli-2', '--json'], env));
    expect(noFit.state).toBe('pending');
    expect(noFit.conditions[0].message).toContain('fabric.domain=fabric-b: 0 of 3 nodes fit');

    const bad = await runCli(['reserve', ...gangArgs('2').filter((a) => a !== '--gang' && a !== '2')], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--topology-key needs --gang');
  });
});
