import { beforeAll, describe, expect, it } from 'vitest';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { applyNodeInventory, type NodeInventorySections } from '../../db/nodes/inventory.ts';
import type { GpuInventory, HostSection } from '../../domain/inventory-sections.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

// applyNodeInventory writes every kind of row in one statement: each kind checked here.
const t = useTestDatabase();
let node: RegisteredNode;
let poolId: string;

beforeAll(async () => {
  const pool = await seedPool(t.db, { nodes: 1 });
  node = pool.nodes[0]!;
  poolId = pool.poolId;
});

const gpu = (index: number, extra: Partial<GpuInventory> = {}): GpuInventory => ({
  uuid: `GPU-test-${index}`,
  index,
  model: 'NVIDIA H100 80GB HBM3',
  memoryMiB: 81_559,
  nvlinkDomain: 'nv0',
  numaNode: 0,
  health: 'healthy',
  ...extra,
});
const host = (extra: Partial<HostSection> = {}): HostSection => ({
  hostname: 'inv-test',
  vcpu: 64,
  memoryGiB: 512,
  hugepages1Gi: 0,
  pciGpuCount: 2,
  ...extra,
});

const epoch = async () =>
  Number(
    (await t.db.selectFrom('nodes').select('epoch').where('id', '=', node.id).executeTakeFirstOrThrow())
      .epoch,
  );
const apply = async (sections: NodeInventorySections, fenceEpoch?: number) => {
  const fence = { nodeId: node.id, epoch: fenceEpoch ?? (await epoch()) };
  return t.db.transaction().execute((trx) => applyNodeInventory(trx, fence, sections));
};
const devices = () =>
  t.db
    .selectFrom('devices')
    .select(['id', 'class', 'stable_id', 'parent_id', 'bookable', 'removed_at'])
    .where('node_id', '=', node.id)
    .where('stable_id', 'like', '%test%')
    .orderBy('stable_id')
    .execute();
const conditions = async () =>
  (
    await t.db
      .selectFrom('node_conditions')
      .select(['type', 'message'])
      .where('node_id', '=', node.id)
      .orderBy('type')
      .execute()
  ).map((c) => `${c.type}: ${c.message}`);
const labels = async () =>
  (
    await t.db
      .selectFrom('node_labels')
      .select(['key', 'value'])
      .where('node_id', '=', node.id)
      .where('source', '=', 'inventory')
      .orderBy('key')
      .execute()
  ).map((l) => `${l.key}=${l.value}`);

describe('one inventory statement', () => {
  it('makes an enrolling node that converged its spec ready with its first inventory', async () => {
    await t.db.deleteFrom('inventory_snapshots').where('node_id', '=', node.id).execute();
    await t.db
      .updateTable('nodes')
      .set({ provision_state: 'enrolling', observed_generation: 1 })
      .where('id', '=', node.id)
      .execute();
    expect(await apply({ host: host(), gpus: { gpus: [gpu(0), gpu(1)] } })).not.toBeNull();
    const row = await t.db
      .selectFrom('nodes')
      .select('provision_state')
      .where('id', '=', node.id)
      .executeTakeFirstOrThrow();
    expect(row.provision_state).toBe('ready');
    expect(await labels()).toEqual(['bc.dev/gpu.count=2', 'bc.dev/gpu.model=nvidia-h100-80gb-hbm3']);
    expect(await conditions()).toEqual([]);
    const resources = await t.db
      .selectFrom('host_resources')
      .select(['resource', 'capacity', 'allocatable'])
      .where('node_id', '=', node.id)
      .orderBy('resource')
      .execute();
    expect(resources.map((r) => [r.resource, Number(r.capacity), Number(r.allocatable)])).toEqual([
      ['hugepages1Gi', 0, 0],
      ['memoryGiB', 512, 512],
      ['vcpu', 64, 62],
    ]);
  });

  it('raises GpuCountMismatch against the stored PCI count when only the GPUs are sent, and clears it', async () => {
    expect(await apply({ gpus: { gpus: [gpu(0)] } })).not.toBeNull();
    expect(await conditions()).toEqual(['GpuCountMismatch: the PCI bus has 2 GPUs, the driver sees 1']);
    const rows = await devices();
    expect(rows.map((d) => [d.stable_id, d.removed_at !== null])).toEqual([
      ['GPU-test-0', false],
      ['GPU-test-1', true],
    ]);
    expect(await labels()).toEqual(['bc.dev/gpu.count=1', 'bc.dev/gpu.model=nvidia-h100-80gb-hbm3']);
    // Only the host, now counting one on the bus: the stored GPUs agree.
    expect(
      await apply({ host: host({ pciGpuCount: 1, foreignGpuResources: ['nvidia.com/gpu'] }) }),
    ).not.toBeNull();
    expect(await conditions()).toEqual([
      "ForeignGpuExposure: the kubelet can hand this node's GPUs to pods through nvidia.com/gpu, not only through bcd",
    ]);
    expect(await apply({ host: host({ pciGpuCount: 1 }) })).not.toBeNull();
    expect(await conditions()).toEqual([]);
  });

  it('writes MIG instances as atoms of their GPU in a MIG pool, and brings a removed GPU back', async () => {
    await t.db.updateTable('pools').set({ sharing_mode: 'mig' }).where('id', '=', poolId).execute();
    try {
      const mig = (index: number) => ({
        mode: 'enabled' as const,
        instances: [0, 1].map((i) => ({
          uuid: `MIG-test-${index}-${i}`,
          profile: '3g.40gb',
          gpuInstanceId: i + 1,
          computeInstanceId: 0,
          memoryMiB: 40_000,
        })),
      });
      expect(
        await apply({ gpus: { gpus: [gpu(0, { mig: mig(0) }), gpu(1, { mig: mig(1) })] } }),
      ).not.toBeNull();
      const rows = await devices();
      const byStable = new Map(rows.map((d) => [d.stable_id, d]));
      for (const index of [0, 1]) {
        const parent = byStable.get(`GPU-test-${index}`)!;
        expect(parent).toMatchObject({ class: 'gpu', bookable: false, removed_at: null });
        for (const i of [0, 1]) {
          expect(byStable.get(`MIG-test-${index}-${i}`)).toMatchObject({
            class: 'gpu.mig',
            parent_id: parent.id,
            bookable: true,
            removed_at: null,
          });
        }
      }
      // MIG turned off on GPU 1: its atoms are removed, the GPU itself stays.
      expect(await apply({ gpus: { gpus: [gpu(0, { mig: mig(0) }), gpu(1)] } })).not.toBeNull();
      const after = new Map((await devices()).map((d) => [d.stable_id, d.removed_at !== null]));
      expect(after.get('GPU-test-1')).toBe(false);
      expect(after.get('MIG-test-1-0')).not.toBeNull();
      expect(after.get('MIG-test-0-0')).toBe(false);
    } finally {
      await t.db.updateTable('pools').set({ sharing_mode: 'exclusive' }).where('id', '=', poolId).execute();
    }
  });

  it('answers the live reservations on the node, read under its lock, for their lifecycles to look again', async () => {
    expect(await apply({ host: host({ pciGpuCount: 1 }) })).toEqual({ liveReservationIds: [] });
    const start = new Date('2031-01-01T00:00:00Z');
    const allocationId = await t.db.transaction().execute((trx) =>
      insertBareAllocation(trx, {
        poolId,
        nodeId: node.id,
        start,
        end: new Date(start.getTime() + 3_600_000),
      }),
    );
    const { reservation_id } = await t.db
      .selectFrom('allocations')
      .select('reservation_id')
      .where('id', '=', allocationId)
      .executeTakeFirstOrThrow();
    expect(await apply({ host: host({ pciGpuCount: 1 }) })).toEqual({ liveReservationIds: [reservation_id] });
    await t.db.updateTable('allocations').set({ state: 'released' }).where('id', '=', allocationId).execute();
    expect(await apply({ host: host({ pciGpuCount: 1 }) })).toEqual({ liveReservationIds: [] });
  });

  it('writes nothing for a session a newer one fenced', async () => {
    const before = await t.db
      .selectFrom('inventory_snapshots')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .where('node_id', '=', node.id)
      .executeTakeFirstOrThrow();
    expect(await apply({ gpus: { gpus: [] } }, (await epoch()) - 1)).toBeNull();
    const after = await t.db
      .selectFrom('inventory_snapshots')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .where('node_id', '=', node.id)
      .executeTakeFirstOrThrow();
    expect(after.n).toBe(before.n);
    expect((await devices()).filter((d) => d.removed_at === null).length).toBeGreaterThan(0);
  });
});
