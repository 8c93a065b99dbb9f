import { beforeAll, describe, expect, test, vi } from 'vitest';
import { insertPool, type RegisteredNode, registerReadyNodes } from '../../db/nodes/fleet.ts';
import { useTestApi } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';
import { json, runCli } from './run-cli.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let asRoot: Record<string, string>;
let asAcme: Record<string, string>;
let migNode: RegisteredNode;
let wholeNode: RegisteredNode;
beforeAll(async () => {
  asRoot = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.root.token };
  asAcme = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  const whole = await seedPool(api.database.db, {
    site: 'site-mig-cli',
    ownerTenantId: api.root.tenantId,
    nodes: 1,
    namePrefix: 'whole',
  });
  wholeNode = whole.nodes[0]!;
  const migPool = await insertPool(api.database.db, {
    siteId: whole.siteId,
    ownerTenantId: api.root.tenantId,
    name: 'h100-mig',
    gpuModel: 'h100',
    sharingMode: 'mig',
  });
  const [registered] = await registerReadyNodes(api.database.db, {
    siteId: whole.siteId,
    poolId: migPool,
    count: 1,
    namePrefix: 'mig',
  });
  migNode = registered!;
});

const gpuOf = (node: RegisteredNode, index: number) => `GPU-${node.id.slice(5)}-${index}`;

describe('nodes set-mig-layout', () => {
  test('sets a layout as the NodeSpec mig-layout unit (--json and text); the same again changes nothing', async () => {
    const before = await api.database.db
      .selectFrom('nodes')
      .where('id', '=', migNode.id)
      .select('spec_generation')
      .executeTakeFirstOrThrow();
    const set = json(
      await runCli(
        [
          'nodes',
          'set-mig-layout',
          migNode.id,
          '--gpu',
          `${gpuOf(migNode, 0)}=3g.40gb,3g.40gb`,
          '--gpu',
          `${gpuOf(migNode, 1)}=1g.10gb`,
          '--json',
        ],
        asRoot,
      ),
    );
    expect(set).toEqual({
      nodeId: migNode.id,
      specGeneration: Number(before.spec_generation) + 1,
      changed: true,
    });
    const node = await api.database.db
      .selectFrom('nodes')
      .where('id', '=', migNode.id)
      .select('spec')
      .executeTakeFirstOrThrow();
    expect((node.spec as { host: { units: unknown[] } }).host.units).toEqual([
      {
        unit: 'mig-layout',
        settings: {
          gpus: [
            { uuid: gpuOf(migNode, 0), profiles: ['3g.40gb', '3g.40gb'] },
            { uuid: gpuOf(migNode, 1), profiles: ['1g.10gb'] },
          ].sort((a, b) => a.uuid.localeCompare(b.uuid)),
        },
      },
    ]);
    const again = await runCli(
      ['nodes', 'set-mig-layout', migNode.id, '--gpu', `${gpuOf(migNode, 1)}=1g.10gb`],
      asRoot,
    );
    expect(again.code).toBe(0);
    expect(again.stdout.trim()).toBe(
      `${migNode.id}: already that layout (spec generation ${set.specGeneration})`,
    );
    const audit = await api.database.db
      .selectFrom('audit_events')
      .where('resource_id', '=', migNode.id)
      .where('action', '=', 'compute:nodes:configure')
      .select('id')
      .execute();
    expect(audit).toHaveLength(1);
  });

  test('refusals: a node outside a mig pool, a GPU the node lacks, another tenant, a malformed --gpu', async () => {
    const [exclusive, unknownGpu, denied, malformed] = await Promise.all([
      runCli(['nodes', 'set-mig-layout', wholeNode.id, '--gpu', `${gpuOf(wholeNode, 0)}=1g.10gb`], asRoot),
      runCli(
        ['nodes', 'set-mig-layout', migNode.id, '--gpu', 'GPU-not-on-this-node=1g.10gb', '--json'],
        asRoot,
      ),
      runCli(['nodes', 'set-mig-layout', migNode.id, '--gpu', `${gpuOf(migNode, 0)}=1g.10gb`], asAcme),
      runCli(['nodes', 'set-mig-layout', migNode.id, '--gpu', '1g.10gb'], asRoot),
    ]);
    expect(exclusive.code).toBe(3);
    expect(exclusive.stderr).toMatch(
      /INVALID_STATE: .*shares its GPUs as exclusive; MIG layouts apply to nodes of a mig pool/,
    );
    expect(unknownGpu.code).toBe(2);
    const { error } = JSON.parse(unknownGpu.stdout) as { error: { code: string; message: string } };
    expect(error).toMatchObject({ code: 'INVALID_INPUT' });
    expect(error.message).toContain('GPU-not-on-this-node');
    expect(denied.code).toBe(3);
    expect(denied.stderr).toMatch(/NOT_FOUND: /);
    expect(malformed.code).toBe(2);
    expect(malformed.stderr).toContain('expected <gpu uuid>=<profile>');
  });
});
