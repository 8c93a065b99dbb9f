import path from 'node:path';
import type { Config } from '../../core/config.ts';
import type { Db } from '../../core/database.ts';
import type { ReservationLifecycle } from '../../core/deps.ts';
import type { Logger } from '../../core/logger.ts';
import type { BootNetwork } from '../../daemon/boot-network.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import {
  type EmulatedSystem,
  type RedfishEmulator,
  startRedfishEmulator,
} from '../../daemon/redfish-emulator.ts';
import { type StartedSiteAgent, startSiteAgent } from '../../daemon/site-agent.ts';
import type { GatewayOptions } from '../../gateway/options.ts';
import { type StartedGateway, startGateway } from '../../gateway/server.ts';
import { defaultToolsDir } from '../../temporal/dev-server.ts';
import { eventually } from './eventually.ts';

/** Calls one API method as an operator allowed to run the site (root), answering `data`. */
export type MetalCall = (method: string, body: unknown) => Promise<any>;

export interface MetalSite {
  siteId: string;
  poolId: string;
  siteToken: string;
  gateway: StartedGateway;
  emulator: RedfishEmulator;
  /** The site agents started, the first holding the boot lease. */
  agents: StartedSiteAgent[];
  /** The enrolled machines' node ids, in the order of `emulator.systems`. */
  machines: string[];
  startAgent(name: string): Promise<StartedSiteAgent>;
  stop(): Promise<void>;
}

/** `count` emulated systems named `<prefix>-1…` with stable UUIDs and MACs. */
export function emulatedSystems(count: number, prefix = 'metal'): EmulatedSystem[] {
  return Array.from({ length: count }, (_, i) => {
    const n = (i + 1).toString(16).padStart(2, '0');
    return {
      uuid: `0b7c8a55-0000-4000-8000-0000000000${n}`,
      name: `${prefix}-${i + 1}`,
      macs: [`52:54:00:00:00:${n}`],
    };
  });
}

/**
 * A real site for a test: a gateway (mutual TLS, `config`'s deployment secret, so the BMC
 * credentials the API sealed open on the wire), the Redfish emulator of sushy-tools with
 * `machines` systems, one site agent of role `site` holding `site:<id>:boot`, and the machines
 * enrolled through `metal.enroll` in a pool of the site. Nothing is faked: the BMC commands run
 * against the emulator over Redfish.
 */
export async function startMetalSite(input: {
  db: Db;
  config: Config;
  call: MetalCall;
  dir: string;
  log: Logger;
  machines: number;
  name?: string;
  notifyUrl?: string;
  gatewayOptions?: Partial<GatewayOptions>;
  /** What the gateway wakes workflows through (a provisioning workflow when its step's wait ends). */
  lifecycle?: ReservationLifecycle;
  /** The boot network the site agents serve on (simulated machines boot from it). */
  bootNetwork?: BootNetwork;
  /** Start each machine's inspection at enrollment (needs a Temporal worker). */
  inspect?: boolean;
  /** Called once the emulator runs, before the site agent starts (to attach simulated machines). */
  onEmulator?: (emulator: RedfishEmulator, gateway: StartedGateway) => Promise<void>;
}): Promise<MetalSite> {
  const name = input.name ?? 'metal-site';
  const gateway = await startGateway({
    config: input.config,
    db: input.db,
    log: input.log,
    ...(input.lifecycle ? { lifecycle: input.lifecycle } : {}),
    host: '127.0.0.1',
    port: 0,
    options: { deliveryIntervalMs: 50, ...input.gatewayOptions },
  });
  const stops: Array<() => Promise<void>> = [() => gateway.stop()];
  const stop = async () => {
    for (const step of stops.reverse()) await step().catch(() => {});
  };
  try {
    const emulator = await startRedfishEmulator({
      toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      dataDir: path.join(input.dir, `${name}-bmc`),
      systems: emulatedSystems(input.machines, name),
      username: 'bmc-admin',
      password: 'bmc-secret-p4ss',
      log: input.log,
      ...(input.notifyUrl ? { notifyUrl: input.notifyUrl } : {}),
    });
    stops.push(() => emulator.stop());
    await input.onEmulator?.(emulator, gateway);
    const siteId = (await input.call('sites/create', { name, region: 'test-1' })).id as string;
    const poolId = (await input.call('admin/createPool', { siteId, name: `${name}-pool`, gpuModel: 'h100' }))
      .id as string;
    const siteToken = (await input.call('sites/createToken', { siteId, maxUses: 4 })).token as string;
    const agents: StartedSiteAgent[] = [];
    const startAgent = async (agentName: string) => {
      const agent = await startSiteAgent({
        gatewayAddress: gateway.address,
        caCertificatePem: gateway.caCertificatePem,
        token: siteToken,
        dir: path.join(input.dir, agentName),
        name: agentName,
        hardware: new SimHardware(path.join(input.dir, agentName), {
          gpus: 0,
          gpuModel: 'none',
          gpuMemoryMiB: 0,
          nvlinkDomainSize: 1,
          numaNodes: 1,
          vcpu: 8,
          memoryGiB: 16,
          hugepages1Gi: 0,
        }),
        log: input.log,
        redfish: { requestTimeoutMs: 5_000, powerTimeoutMs: 30_000 },
        ...(input.bootNetwork ? { bootNetwork: input.bootNetwork } : {}),
        minBackoffMs: 100,
        maxBackoffMs: 500,
      });
      agents.push(agent);
      stops.push(() => agent.stop());
      return agent;
    };
    const first = await startAgent(`${name}-agent`);
    await eventually(
      async () =>
        (await input.call('sites/get', { siteId })).bootLease?.holderNodeId === first.identity.nodeId,
      60_000,
    );
    const machines: string[] = [];
    for (const system of emulator.systems) {
      const enrolled = await input.call('metal/enroll', {
        siteId,
        poolId,
        name: system.name,
        bmc: {
          address: emulator.address,
          systemId: system.uuid,
          username: emulator.username,
          password: emulator.password,
        },
        inspect: input.inspect ?? false,
      });
      machines.push(enrolled.nodeId as string);
    }
    return { siteId, poolId, siteToken, gateway, emulator, agents, machines, startAgent, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
