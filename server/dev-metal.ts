import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import { BootNetwork } from '../daemon/boot-network.ts';
import { SimHardware } from '../daemon/hardware.ts';
import { MetalMachines } from '../daemon/metal-machines.ts';
import { startRedfishEmulator } from '../daemon/redfish-emulator.ts';
import { startSiteAgent } from '../daemon/site-agent.ts';
import { signImage } from '../domain/metal-images.ts';
import { defaultToolsDir } from '../temporal/dev-server.ts';
import type { ControlPlane } from './serve.ts';

export interface DevMetal {
  sites: Array<{ id: string; name: string; machines: string[] }>;
  profiles: Array<{ id: string; name: string; version: number }>;
  stop(): Promise<void>;
}

const siteName = 'metal-dc';
const machineCount = 4;
const bmcUser = 'dev-bmc';
const bmcPassword = 'dev-bmc-password';

/**
 * The dev stack's bare metal: one site with its site agent (`bcd site`, joined once, its identity
 * kept in the data directory), the Redfish emulator of sushy-tools (installed into the tools
 * cache on first use) with 4 systems, simulated machines behind it that follow its power and
 * boot device, a demo image signed with the dev signer (served on loopback) and a demo profile
 * using it. The machines are enrolled once and inspected over their ramdisk (they become `ready`
 * a minute or so after the stack is up). Without python3's venv or PyPI the site is left out, with
 * a warning.
 */
export async function seedDevMetal(input: {
  plane: ControlPlane;
  dataDir: string;
  rootToken: string;
  signer: { privateKeyPem: string };
  log: Logger;
  /** The dev stack's watchdog: the Redfish emulator (its own process group) never outlives it. */
  watchdog?: { watch(pid: number, signal: NodeJS.Signals): void; unwatch(pid: number): void };
}): Promise<DevMetal> {
  const { plane, log } = input;
  const none: DevMetal = { sites: [], profiles: [], stop: async () => {} };
  if (!plane.gateway) return none;
  const dir = path.join(input.dataDir, 'metal');
  mkdirSync(dir, { recursive: true });
  const cred = { token: input.rootToken };
  const api = plane.compute.api;
  const stops: Array<() => Promise<void>> = [];
  const stop = async () => {
    for (const s of stops.reverse())
      await s().catch((err) => log.warn({ err }, 'error while stopping metal'));
  };
  try {
    // The demo image: bytes made once, served on loopback, signed by the dev signer.
    const imageFile = path.join(dir, 'demo-image.raw');
    if (!existsSync(imageFile))
      writeFileSync(imageFile, Buffer.from('better-compute demo image\n'.repeat(65_536)));
    const imageBytes = readFileSync(imageFile);
    const imageServer: Server = createServer((request, response) => {
      if (request.url === '/images/demo.raw') response.writeHead(200).end(imageBytes);
      else response.writeHead(404).end();
    });
    await new Promise<void>((resolve) => imageServer.listen(0, '127.0.0.1', resolve));
    stops.push(() => new Promise<void>((resolve) => imageServer.close(() => resolve())));
    const imageUrl = `http://127.0.0.1:${(imageServer.address() as { port: number }).port}/images/demo.raw`;

    const systems = Array.from({ length: machineCount }, (_, i) => ({
      uuid: `5e5e0000-0000-4000-8000-00000000000${i + 1}`,
      name: `metal-${i + 1}`,
      macs: [`52:54:00:5e:00:0${i + 1}`],
    }));
    const network = new BootNetwork();
    const machines = new MetalMachines({
      dir: path.join(dir, 'machines'),
      log: log.child({ component: 'metal' }),
      network,
      systems,
    });
    const notifyUrl = await machines.listen();
    stops.push(() => machines.stop());
    machines.attach({ address: plane.gateway.address, caCertificatePem: plane.gateway.caCertificatePem });
    const emulator = await startRedfishEmulator({
      toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      dataDir: path.join(dir, 'bmc'),
      systems,
      username: bmcUser,
      password: bmcPassword,
      notifyUrl,
      log,
      ...(input.watchdog
        ? { detached: true, onSpawn: (pid: number) => input.watchdog?.watch(pid, 'SIGTERM') }
        : {}),
    });
    stops.push(async () => {
      await emulator.stop();
      if (emulator.pid !== undefined) input.watchdog?.unwatch(emulator.pid);
    });

    const { sites } = await api.sites.list(cred, {});
    const site =
      sites.find((s) => s.name === siteName) ??
      (await api.sites.create(cred, { name: siteName, region: 'dev-1' }));
    const { pools } = await api.admin.listPools(cred, {});
    const pool =
      pools.find((p) => p.name === 'metal' && p.siteId === site.id) ??
      (await api.admin.createPool(cred, { siteId: site.id, name: 'metal', gpuModel: 'h100' }));
    const agentDir = path.join(dir, 'site-agent');
    const token = existsSync(path.join(agentDir, 'node.json'))
      ? undefined
      : (await api.sites.createToken(cred, { siteId: site.id, maxUses: 1 })).token;
    const agent = await startSiteAgent({
      gatewayAddress: plane.gateway.address,
      caCertificatePem: plane.gateway.caCertificatePem,
      ...(token ? { token } : {}),
      dir: agentDir,
      name: 'site-agent-1',
      hardware: new SimHardware('metal/site-agent', {
        gpus: 0,
        gpuModel: 'none',
        gpuMemoryMiB: 0,
        nvlinkDomainSize: 1,
        numaNodes: 1,
        vcpu: 8,
        memoryGiB: 16,
        hugepages1Gi: 0,
      }),
      log: log.child({ component: 'site-agent' }),
      bootNetwork: network,
    });
    stops.push(() => agent.stop());

    // The inspection's first BMC command needs the site agent to hold the boot lease.
    const leaseDeadline = Date.now() + 60_000; // wall time: waiting for the site agent's first lease
    while (
      (await api.sites.get(cred, { siteId: site.id })).bootLease?.holderNodeId !== agent.identity.nodeId
    ) {
      if (Date.now() > leaseDeadline)
        throw new Error('the site agent did not take the boot lease within 60 s');
      await new Promise((r) => setTimeout(r, 250));
    }
    // Machines are enrolled (and inspected) once; on later runs they are found by name.
    const { machines: enrolled } = await api.metal.machines(cred, { siteId: site.id });
    const ids: string[] = [];
    for (const system of systems) {
      const found = enrolled.find((m) => m.name === system.name);
      if (found) {
        ids.push(found.nodeId);
        continue;
      }
      const machine = await api.metal.enroll(cred, {
        siteId: site.id,
        poolId: pool.id,
        name: system.name,
        bmc: { address: emulator.address, systemId: system.uuid, username: bmcUser, password: bmcPassword },
        inspect: true,
      });
      ids.push(machine.nodeId);
    }

    const sha256 = createHash('sha256').update(imageBytes).digest('hex');
    const identity = { name: 'demo-ubuntu', version: '24.04', format: 'raw' as const, sha256 };
    const image = await api.images.register(cred, {
      ...identity,
      url: imageUrl,
      signature: signImage(identity, input.signer.privateKeyPem),
    });
    const { profiles } = await api.profiles.list(cred, {});
    const profile =
      profiles.find((p) => p.name === 'demo-gpu' && p.imageId === image.id) ??
      (await api.profiles.create(cred, {
        name: 'demo-gpu',
        spec: {
          imageId: image.id,
          acceptance: ['inventory-reported', 'gpus-present'],
          stepTimeoutSeconds: 180,
        },
      }));
    log.info(
      { siteId: site.id, machines: ids.length, image: image.id, profile: profile.id },
      'bare-metal site ready',
    );
    return {
      sites: [{ id: site.id, name: site.name, machines: ids }],
      profiles: [{ id: profile.id, name: profile.name, version: profile.version }],
      stop,
    };
  } catch (error) {
    log.warn({ err: (error as Error).message }, 'the bare-metal site is left out of the dev stack');
    await stop();
    return none;
  }
}
