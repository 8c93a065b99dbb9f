import { afterAll, beforeAll } from 'vitest';
import { KubeletStandIn } from '../../daemon/kubelet-stand-in.ts';
import type { SimulatedFleet, SimulatedNode } from '../../daemon/sim.ts';
import { insertPool, offerPool } from '../../db/nodes/fleet.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import type { LifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

/** The resource name bcd's device plugin registers for whole GPUs. */
export const gpuResource = 'bcd.dev/gpu';

/**
 * One simulated bcd node with 4 GPUs (NVLink domains of 2) in a kubernetes pool owned by `acme`,
 * joined through a real gateway with mutual TLS, with a stand-in kubelet on its sockets. Started
 * in a beforeAll hook (ready once the node is `ready` with its devices), stopped in an afterAll.
 */
export function useKubernetesNode(h: LifecycleApi, tempDirPrefix: string) {
  const dir = useTempDir(tempDirPrefix);
  let gateway: StartedGateway | undefined;
  let fleet: SimulatedFleet | undefined;
  let node: SimulatedNode | undefined;
  let kubelet: KubeletStandIn | undefined;
  let poolId: string | undefined;
  const started = <T>(value: T | undefined): T => {
    if (value === undefined)
      throw new Error('the kubernetes node was read before its beforeAll hook started it');
    return value;
  };

  beforeAll(async () => {
    gateway = await startTestGateway({ db: h.db, log: h.log, lifecycle: h.lifecycle });
    const k8sPool = await insertPool(h.db, {
      siteId: h.siteId,
      ownerTenantId: 'acme',
      name: 'k8s',
      gpuModel: 'h100',
      policy: { kubernetes: true, perGpu: { vcpu: 0, memoryGiB: 0 } },
    });
    poolId = k8sPool;
    await offerPool(h.db, { poolId: k8sPool, tenantId: 'acme', quota: { gpu: 16 } });
    fleet = await joinSimulatedFleet(gateway, h.db, k8sPool, {
      nodes: 1,
      rootDir: dir,
      log: h.log,
      namePrefix: 'k8s',
      shape: { gpus: 4, nvlinkDomainSize: 2 },
      kubelet: 'external',
      kubeletWatchIntervalMs: 100,
    });
    node = fleet.nodes[0]!;
    kubelet = new KubeletStandIn(node.kubeletDir!);
    await kubelet.start();
    await eventually(async () => {
      const row = await h.db
        .selectFrom('nodes as n')
        .where('n.pool_id', '=', k8sPool)
        .where('n.provision_state', '=', 'ready')
        .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
        .select('n.id')
        .executeTakeFirst();
      return row !== undefined;
    });
  });

  afterAll(async () => {
    await fleet?.stop();
    await kubelet?.stop();
    await gateway?.stop();
  });

  const get = (id: string) =>
    h.compute.api.reservations.get(h.credential, { tenantId: 'acme', reservationId: id });
  return {
    get node(): SimulatedNode {
      return started(node);
    },
    get kubelet(): KubeletStandIn {
      return started(kubelet);
    },
    get poolId(): string {
      return started(poolId);
    },
    /** The GPU ids the kubelet has been given for {@link gpuResource}, sorted. */
    advertised: (): string[] =>
      started(kubelet)
        .devices(gpuResource)
        .map((d) => d.ID)
        .sort(),
    get,
    stateOf: async (id: string) => (await get(id)).state,
  };
}
