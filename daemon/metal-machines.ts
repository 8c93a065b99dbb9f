import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import type { DeployImagePayload } from '../domain/metal-commissioning.ts';
import { createCsr, generateKeyPairPem } from '../domain/pki.ts';
import { type JoinRequest, type JoinResponse, JoinServiceClient } from '../proto/gen/agent/v1/agent.ts';
import { agentVersion, NodeAgent } from './agent.ts';
import type { BootNetwork } from './boot-network.ts';
import type { RamdiskCommandKind } from './commands.ts';
import { gatewayChannel } from './gateway-tls.ts';
import { SimHardware, type SimShape } from './hardware.ts';
import { identityExists, joinWithToken, loadIdentity, type NodeIdentity, saveIdentity } from './identity.ts';

/**
 * Simulated bare machines behind the Redfish emulator: each follows its emulated system's power
 * and boot device, learnt from the emulator's change notifications (`external_notifier`). Powered
 * on from the network, a machine boots the ramdisk its site agent's boot server offers (a real
 * bcd of role `ramdisk` joining with the discovery attestor); from the disk, it boots what a
 * deploy wrote there (a real bcd that joins as the machine's node, proving it with the ramdisk's
 * key), or nothing on an empty disk. Powered off, whatever ran stops. The disk is a directory.
 */

interface MachineState {
  systemId: string;
  name: string;
  hardware: SimHardware;
  dir: string;
  running: { kind: 'ramdisk' | 'os'; agent: NodeAgent } | null;
  booting: Promise<void> | null;
  power: 'On' | 'Off';
  log: string[];
}

export interface MetalMachinesOptions {
  dir: string;
  log: Logger;
  network: BootNetwork;
  systems: Array<{ uuid: string; name: string }>;
  shape?: SimShape;
}

export class MetalMachines {
  private readonly machines = new Map<string, MachineState>();
  private server: Server | null = null;
  /** Test knob: machines whose ramdisk does not come up (a boot that never calls back). */
  readonly silentRamdisks = new Set<string>();
  /** Every ramdisk or system that joined, by machine system id (for tests and the benchmark). */
  readonly boots: Array<{ systemId: string; kind: 'ramdisk' | 'os'; nodeId: string }> = [];
  private gateway: { address: string; caCertificatePem: string } | null = null;

  /** The gateway the machines' agents dial (known once it listens). */
  attach(gateway: { address: string; caCertificatePem: string }): void {
    this.gateway = gateway;
  }

  private gatewayOf(): { address: string; caCertificatePem: string } {
    if (!this.gateway) throw new Error('the simulated machines have no gateway yet: attach() it');
    return this.gateway;
  }

  constructor(private readonly options: MetalMachinesOptions) {
    for (const system of options.systems) {
      const dir = path.join(options.dir, system.name);
      this.machines.set(system.uuid, {
        systemId: system.uuid,
        name: system.name,
        hardware: new SimHardware(`metal/${system.uuid}`, options.shape),
        dir,
        running: null,
        booting: null,
        power: 'Off',
        log: [],
      });
    }
  }

  /** Listens for the emulator's notifications; answers the URL to give it (EXTERNAL_NOTIFICATION_URL). */
  async listen(): Promise<string> {
    this.server = createServer((request, response) => {
      let body = '';
      request.on('data', (chunk: Buffer) => {
        body += chunk.toString();
      });
      request.on('end', () => {
        // Answered at once: the emulator waits for this answer inside its own request.
        response.writeHead(204).end();
        try {
          this.onNotification(JSON.parse(body) as Record<string, unknown>);
        } catch (error) {
          this.options.log.warn({ err: (error as Error).message }, 'bad emulator notification');
        }
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server.address() as { port: number }).port}/notify`;
  }

  /** The machine's disk as a deploy left it (null: empty). */
  disk(systemId: string): { image: DeployImagePayload['image'] } | null {
    const file = path.join(this.machines.get(systemId)?.dir ?? '', 'disk', 'meta.json');
    return existsSync(file)
      ? (JSON.parse(readFileSync(file, 'utf8')) as { image: DeployImagePayload['image'] })
      : null;
  }

  /** What runs on the machine now. */
  running(systemId: string): 'ramdisk' | 'os' | null {
    return this.machines.get(systemId)?.running?.kind ?? null;
  }

  async stop(): Promise<void> {
    for (const machine of this.machines.values()) await this.halt(machine);
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  private onNotification(system: Record<string, unknown>): void {
    const machine = this.machines.get(String(system.uuid));
    if (!machine) return;
    const power = system.power_state === 'On' ? 'On' : 'Off';
    const pending = system.pending_power as { power_state?: string } | null | undefined;
    const bootDevice = String(system.boot_device ?? 'Hdd');
    if (power === 'Off') {
      machine.power = 'Off';
      void this.halt(machine);
      return;
    }
    // On, with a restart or power-off pending: the BMC has not applied it yet.
    if (pending?.power_state && pending.power_state !== 'On') return;
    if (machine.power === 'On' && machine.running) return;
    machine.power = 'On';
    this.boot(machine, bootDevice);
  }

  private boot(machine: MachineState, device: string): void {
    const run = async () => {
      await this.halt(machine);
      if (device === 'Pxe') await this.bootRamdisk(machine);
      else if (device === 'Hdd') await this.bootDisk(machine);
      else
        this.options.log.info(
          { machine: machine.name, device },
          'machine booted from a device with nothing on it',
        );
    };
    machine.booting = run()
      .catch((error: unknown) =>
        this.options.log.warn(
          { machine: machine.name, err: (error as Error).message },
          'machine boot failed',
        ),
      )
      .finally(() => {
        machine.booting = null;
      });
  }

  private async halt(machine: MachineState): Promise<void> {
    const running = machine.running;
    machine.running = null;
    if (running) await running.agent.stop();
  }

  private agentFor(machine: MachineState, identity: NodeIdentity, kind: 'ramdisk' | 'os', stateDir: string) {
    const agent = new NodeAgent({
      identity,
      stateDir,
      roots: { cdiDir: path.join(stateDir, 'cdi'), envDir: path.join(stateDir, 'allocations') },
      hardware: machine.hardware,
      log: this.options.log.child({ machine: machine.name, boot: kind }),
      ...(kind === 'ramdisk'
        ? {
            ramdiskCommands: (k: RamdiskCommandKind, payload: Record<string, unknown>) =>
              this.ramdisk(machine, identity, k, payload),
          }
        : {}),
      minBackoffMs: 100,
      maxBackoffMs: 1_000,
    });
    machine.running = { kind, agent };
    this.boots.push({ systemId: machine.systemId, kind, nodeId: identity.nodeId });
    agent.start();
  }

  private async bootRamdisk(machine: MachineState): Promise<void> {
    const offer = this.options.network.take(machine.systemId);
    if (!offer) {
      this.options.log.info(
        { machine: machine.name },
        'network boot: no boot server offers this machine anything',
      );
      return;
    }
    if (this.silentRamdisks.has(machine.systemId)) return;
    const dir = path.join(machine.dir, 'ramdisk');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    const keys = await generateKeyPairPem();
    const csrPem = await createCsr(keys, machine.name);
    const request: JoinRequest = {
      token: offer.discoveryToken,
      csrPem,
      evidence: machine.hardware.evidence(),
      requestedName: machine.name,
      agentVersion,
      reclaimProof: offer.assert(csrPem),
    };
    const gateway = this.gatewayOf();
    const tls = gatewayChannel(gateway.address, { caCertificatePem: gateway.caCertificatePem });
    const client = new JoinServiceClient(gateway.address, tls.credentials, tls.options);
    let response: JoinResponse;
    try {
      response = await new Promise<JoinResponse>((resolve, reject) =>
        client.join(request, (error, answer) => (error ? reject(error) : resolve(answer))),
      );
    } finally {
      client.close();
    }
    if (machine.power !== 'On') return;
    const identity: NodeIdentity = {
      nodeId: response.nodeId,
      nodeName: response.nodeName,
      siteId: response.siteId,
      poolId: response.poolId,
      spiffeId: response.spiffeId,
      gateway: gateway.address,
      privateKeyPem: keys.privateKeyPem,
      publicKeyPem: keys.publicKeyPem,
      certificatePem: response.certificatePem,
      caCertificatePem: response.caCertificatePem,
    };
    saveIdentity(dir, identity);
    this.agentFor(machine, identity, 'ramdisk', dir);
  }

  private async bootDisk(machine: MachineState): Promise<void> {
    const disk = path.join(machine.dir, 'disk');
    const meta = path.join(disk, 'meta.json');
    if (!existsSync(meta)) {
      this.options.log.info({ machine: machine.name }, 'disk boot: the disk is empty');
      return;
    }
    const osDir = path.join(disk, 'bcd');
    if (!identityExists(osDir) || existsSync(path.join(disk, 'first-boot.json'))) {
      // First boot: the system joins as the machine's node, proving it with the ramdisk's key
      // (the ramdisk's identity was written to the disk; joinWithToken signs the reclaim proof).
      const firstBoot = JSON.parse(readFileSync(path.join(disk, 'first-boot.json'), 'utf8')) as {
        discoveryToken: string;
      };
      const gateway = this.gatewayOf();
      const joined = await joinWithToken({
        gateway: gateway.address,
        token: firstBoot.discoveryToken,
        caCertificatePem: gateway.caCertificatePem,
        dir: osDir,
        evidence: machine.hardware.evidence(),
        requestedName: machine.name,
        agentVersion,
      });
      rmSync(path.join(disk, 'first-boot.json'), { force: true });
      if (machine.power !== 'On') return;
      this.agentFor(machine, joined, 'os', osDir);
      return;
    }
    this.agentFor(machine, { ...loadIdentity(osDir), gateway: this.gatewayOf().address }, 'os', osDir);
  }

  /** The ramdisk's commissioning commands, against the machine's (directory) disk. */
  private async ramdisk(
    machine: MachineState,
    identity: NodeIdentity,
    kind: RamdiskCommandKind,
    payload: Record<string, unknown>,
  ): Promise<unknown> {
    const disk = path.join(machine.dir, 'disk');
    machine.log.push(`${kind} ${JSON.stringify(payload).slice(0, 200)}`);
    switch (kind) {
      case 'disk.wipe':
        rmSync(disk, { recursive: true, force: true });
        return { wiped: true };
      case 'deploy.image': {
        const deploy = payload as unknown as DeployImagePayload;
        const response = await fetch(deploy.image.url, { signal: AbortSignal.timeout(60_000) });
        if (!response.ok || !response.body) {
          throw new Error(`image ${deploy.image.url}: HTTP ${response.status}`);
        }
        const hash = createHash('sha256');
        let bytes = 0;
        for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
          hash.update(chunk);
          bytes += chunk.length;
        }
        const digest = hash.digest('hex');
        if (digest !== deploy.image.sha256) {
          throw new Error(
            `digest mismatch: ${deploy.image.url} streamed sha256 ${digest}, the image ${deploy.image.name}@${deploy.image.version} is registered with ${deploy.image.sha256}`,
          );
        }
        rmSync(disk, { recursive: true, force: true });
        mkdirSync(disk, { recursive: true });
        // The ramdisk's identity goes with the system: its key proves the first join.
        cpSync(path.join(machine.dir, 'ramdisk'), path.join(disk, 'bcd'), { recursive: true });
        writeFileSync(path.join(disk, 'first-boot.json'), JSON.stringify(deploy.firstBoot));
        writeFileSync(path.join(disk, 'meta.json'), JSON.stringify({ image: deploy.image, bytes }));
        return {
          image: `${deploy.image.name}@${deploy.image.version}`,
          sha256: digest,
          bytes,
          nodeId: identity.nodeId,
        };
      }
      case 'boot.kexec':
        setTimeout(() => this.boot(machine, 'Hdd'), 50);
        return { kexec: true };
      case 'logs.collect':
        return { lines: machine.log.slice(-50) };
      default:
        throw new Error(`unknown ramdisk command ${kind as string}`);
    }
  }
}
