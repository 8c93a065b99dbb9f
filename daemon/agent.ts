import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { type ClientDuplexStream, Metadata, status } from '@grpc/grpc-js';
import type { Logger } from '../core/logger.ts';
import { assertNever } from '../domain/errors.ts';
import { sectionHash } from '../domain/inventory-sections.ts';
import { certificateNotAfter } from '../domain/pki.ts';
import { currentProtocolVersion } from '../domain/release-version.ts';
import {
  type AgentMessage,
  AgentServiceClient,
  type Command,
  type ControlMessage,
  type Lane,
} from '../proto/gen/agent/v1/agent.ts';
import type { CgroupDriver } from './cgroups.ts';
import { type CommandHost, runCommand } from './commands.ts';
import { KubeletDevicePlugin } from './device-plugin.ts';
import type { DeviceRoots, HeldAllocation } from './devices.ts';
import { gatewayChannel } from './gateway-tls.ts';
import type { Hardware } from './hardware.ts';
import { type NodeIdentity, renewCertificate } from './identity.ts';
import { Journal } from './journal.ts';
import { KeyedRunner } from './keyed-runner.ts';
import type { SelfUpdater } from './self-update.ts';
import { SpecConverger } from './spec-converger.ts';

export const agentVersion = '0.1.0';
/** `devices.limits` is advertised only by an agent that makes slices (it has a cgroup driver). */
export const agentCapabilities = ['devices.limits'];
/** Advertised only by an agent configured with the kubelet's device-plugin directory. */
export const kubernetesBindingCapability = 'binding.kubernetes';

export interface AgentOptions {
  identity: NodeIdentity;
  stateDir: string;
  roots: DeviceRoots;
  hardware: Hardware;
  log: Logger;
  /** Where holds' slices are made; without it the agent enforces no limits and says so (no `devices.limits`). */
  cgroups?: CgroupDriver | null;
  /** How often holds are re-checked and empty slices swept without a new spec (default 5 s). */
  passIntervalMs?: number;
  /** A site agent's runner of `bmc.*` commands (`bcd site`); a node agent has none. */
  siteCommands?: CommandHost['siteCommands'];
  /**
   * Commands run side by side (a site agent's `bmc.*`, one queue per machine): `key` names the
   * queue a command runs in, in order, or null for its lane's; at most `concurrency` keyed
   * commands run at once.
   */
  commandQueues?: { key(command: Command): string | null; concurrency: number };
  ramdiskCommands?: CommandHost['ramdiskCommands'];
  /** A/B self-update (bcd sim only): the version and protocol it declares come from its slot. */
  selfUpdate?: SelfUpdater;
  /**
   * Every gateway address this agent may use (several gateways behind no load balancer): it starts
   * at `identity.gateway` and, when a session could not be opened there, tries the next one.
   */
  gateways?: string[];
  /** Reconnect back-off bounds (a gateway's retry pushback overrides them). */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * The kubelet's device-plugin directory: bcd serves its device plugin there (`kubernetes`
   * bindings) and advertises the `binding.kubernetes` capability.
   */
  kubelet?: { deviceDir: string; watchIntervalMs?: number };
}

export interface AgentStatus {
  nodeId: string;
  connected: boolean;
  epoch: number;
  sessions: number;
  convergedGeneration: number;
  held: HeldAllocation[];
  certificateNotAfter: Date;
  lastPushbackMs: number | null;
  commandsRun: number;
  /** The gateway address the agent dials now. */
  gateway: string;
}

/**
 * One node agent: dials out to the gateway, says Hello, keeps the session alive with heartbeats,
 * sends inventory sections whose hash changed, converges the NodeSpec (refusing one older than it
 * converged), runs commands per lane in order under its journal, reports holds as node-signed
 * attested reports, renews its certificate, and reconnects (honouring retry pushback).
 */
export class NodeAgent {
  readonly journal: Journal;
  /** bcd's Kubernetes device plugin, when the agent was given the kubelet's directory. */
  readonly devicePlugin: KubeletDevicePlugin | null;
  private readonly converger: SpecConverger;
  private stopped = false;
  private silenced = false;
  private stream: ClientDuplexStream<AgentMessage, ControlMessage> | null = null;
  private client: AgentServiceClient | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  private renewTimer: NodeJS.Timeout | null = null;
  private passTimer: NodeJS.Timeout | null = null;
  private renewing = false;
  private lanes = new Map<Lane, Promise<void>>();
  private readonly keyed: KeyedRunner | null;
  private loop: Promise<void> | null = null;
  private wake: (() => void) | null = null;
  readonly status: AgentStatus;

  constructor(private readonly options: AgentOptions) {
    this.journal = new Journal(options.stateDir);
    this.keyed = options.commandQueues ? new KeyedRunner(options.commandQueues.concurrency) : null;
    this.devicePlugin = options.kubelet
      ? new KubeletDevicePlugin({
          dir: options.kubelet.deviceDir,
          log: options.log.child({ component: 'device-plugin' }),
          ...(options.kubelet.watchIntervalMs ? { watchIntervalMs: options.kubelet.watchIntervalMs } : {}),
          // A list the kubelet newly holds binds its holds: report at once, outside the stream's handler.
          advertisedChanged: () => setImmediate(() => this.convergePass()),
          foreignChanged: () => this.sendInventory(['host']),
          // Pods let go of withdrawn GPUs: their holds are reported released at once.
          podsChanged: () => setImmediate(() => this.convergePass()),
        })
      : null;
    const plugin = this.devicePlugin;
    this.converger = new SpecConverger({
      roots: options.roots,
      journal: this.journal,
      identity: options.identity,
      log: options.log,
      send: (message) => this.send(message),
      hardware: options.hardware,
      cgroups: options.cgroups ?? null,
      inventoryChanged: () => this.sendInventory(['gpus']),
      ...(plugin
        ? {
            kubernetesPodsHolding: (stableIds) => plugin.podsHolding(stableIds),
            kubernetesAdvertised: (hold) =>
              plugin.advertised({ allocationId: hold.allocationId, stableIds: hold.gpuUuids }),
            holdsChanged: (held) =>
              plugin.update(
                held
                  .filter((h) => h.binding === 'kubernetes')
                  .map((h) => ({ allocationId: h.allocationId, stableIds: h.gpuUuids })),
                options.hardware.gpus().gpus,
              ),
          }
        : {}),
    });
    this.status = {
      nodeId: options.identity.nodeId,
      connected: false,
      epoch: 0,
      sessions: 0,
      convergedGeneration: this.converger.generation,
      held: [],
      certificateNotAfter: certificateNotAfter(options.identity.certificatePem),
      lastPushbackMs: null,
      commandsRun: 0,
      gateway: options.identity.gateway,
    };
  }

  start(): void {
    this.stopped = false;
    this.devicePlugin?.start();
    this.loop = this.run();
    // Sessions last for days: renewal is checked on a timer too, not only before reconnecting.
    this.renewTimer = setInterval(() => void this.maybeRenew(), 10 * 60_000);
    this.renewTimer.unref();
    // Holds are re-checked against the hardware (a GPU that fell off fails its hold; one that came
    // back binds again) and empty slices of released holds removed, retrying every pass.
    this.passTimer = setInterval(() => this.convergePass(), this.options.passIntervalMs ?? 5_000);
    this.passTimer.unref();
  }

  /** One converge pass outside a spec (also what tests call to act at once). */
  convergePass(): void {
    if (this.stopped) return;
    this.converger.pass();
    this.status.held = this.converger.heldAllocations();
  }

  /** Stops at once: no journal entry is completed on the way out (a crash, for tests). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.renewTimer) clearInterval(this.renewTimer);
    if (this.passTimer) clearInterval(this.passTimer);
    this.options.selfUpdate?.stop();
    this.wake?.();
    this.closeStream();
    await this.loop;
    await this.devicePlugin?.stop();
  }

  /** Stops sending anything (heartbeats included) while keeping the connection open. */
  silence(on: boolean): void {
    this.silenced = on;
  }

  /** What `bcd status` reads about the session. */
  private writeSession(): void {
    const body = {
      connected: this.status.connected,
      epoch: this.status.epoch,
      updatedAt: new Date().toISOString(),
    };
    try {
      writeFileSync(path.join(this.options.stateDir, 'session.json'), JSON.stringify(body));
    } catch {
      // status is best effort
    }
  }

  private closeStream(): void {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.stream?.cancel();
    this.stream = null;
    this.client?.close();
    this.client = null;
    if (this.status.connected) {
      this.status.connected = false;
      this.writeSession();
    }
  }

  private async run(): Promise<void> {
    const minBackoff = this.options.minBackoffMs ?? 500;
    const maxBackoff = this.options.maxBackoffMs ?? 30_000;
    let backoff = minBackoff;
    await this.journal.persist();
    while (!this.stopped) {
      await this.maybeRenew();
      const outcome = await this.session();
      if (this.stopped) break;
      let delay: number;
      if (outcome.pushbackMs !== null) {
        delay = outcome.pushbackMs;
        this.status.lastPushbackMs = delay;
      } else {
        delay = outcome.welcomed ? minBackoff : backoff;
        backoff = outcome.welcomed ? minBackoff : Math.min(maxBackoff, backoff * 2);
        // A gateway that could not open a session (gone, unreachable) is left for the next one.
        if (!outcome.welcomed) this.nextGateway();
        delay = Math.round(delay * (0.5 + Math.random() * 0.5));
      }
      this.options.log.debug({ delay, code: outcome.code }, 'reconnecting');
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delay);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  private async maybeRenew(): Promise<void> {
    const { identity } = this.options;
    const notAfter = this.status.certificateNotAfter.getTime();
    const now = Date.now();
    // Renew once a third of a day's lifetime is left (or it already expired: renewal is refused
    // then, and the node must join again).
    if (this.renewing || notAfter - now > 8 * 3600_000 || notAfter <= now) return;
    // A ramdisk's certificate lasts at most 2 hours by design and the gateway refuses to renew it.
    if (this.options.ramdiskCommands) return;
    this.renewing = true;
    try {
      this.status.certificateNotAfter = await renewCertificate(
        { ...identity, gateway: this.status.gateway },
        this.options.stateDir,
      );
      this.options.log.info({ notAfter: this.status.certificateNotAfter }, 'certificate renewed');
      // Renewal revokes the old certificate (superseded): the gateway would end a session opened
      // with it at its next certificate check, so move to the new one now.
      if (this.stream && !this.stopped) this.closeStream();
    } catch (err) {
      this.options.log.warn({ err }, 'certificate renewal failed');
    } finally {
      this.renewing = false;
    }
  }

  private nextGateway(): void {
    const gateways = this.options.gateways ?? [];
    if (gateways.length < 2) return;
    const at = gateways.indexOf(this.status.gateway);
    this.status.gateway = gateways[(at + 1) % gateways.length]!;
    this.options.log.info({ gateway: this.status.gateway }, 'trying the next gateway');
  }

  /** One session: resolves when the stream ends, with the gateway's pushback if it gave one. */
  private session(): Promise<{ welcomed: boolean; pushbackMs: number | null; code: number | null }> {
    const { identity } = this.options;
    const gateway = this.status.gateway;
    const tls = gatewayChannel(gateway, identity);
    const client = new AgentServiceClient(gateway, tls.credentials, {
      ...tls.options,
      'grpc.keepalive_time_ms': 30_000,
      'grpc.enable_retries': 0,
    });
    this.client = client;
    const stream = client.session(new Metadata());
    this.stream = stream;
    let welcomed = false;
    this.converger.newSession();
    this.options.selfUpdate?.beforeSession();
    const running = this.options.selfUpdate?.current();
    return new Promise((resolve) => {
      let done = false;
      const finish = (code: number | null, metadata?: Metadata) => {
        if (done) return;
        done = true;
        const pushback = metadata?.get('grpc-retry-pushback-ms')[0];
        if (this.stream === stream) this.closeStream();
        else client.close();
        resolve({ welcomed, pushbackMs: pushback !== undefined ? Number(pushback) : null, code });
      };
      stream.on('data', (message: ControlMessage) => {
        if (message.body?.$case === 'welcome') welcomed = true;
        this.onMessage(message);
      });
      stream.on('error', (err: { code?: number; metadata?: Metadata }) => {
        if (err.code !== status.CANCELLED) this.options.log.debug({ code: err.code }, 'session ended');
        finish(err.code ?? null, err.metadata);
      });
      stream.on('end', () => finish(null));
      this.send({
        body: {
          $case: 'hello',
          value: {
            nodeId: identity.nodeId,
            agentVersion: running?.version ?? agentVersion,
            protocolVersion: running?.protocolVersion ?? currentProtocolVersion,
            capabilities: [
              ...(this.options.cgroups ? agentCapabilities : []),
              ...(this.devicePlugin ? [kubernetesBindingCapability] : []),
            ],
            journalId: this.journal.journalId,
            lastAckedSeq: this.journal.lastAckedSeq,
            observedGeneration: this.converger.generation,
            inventory: [
              { name: 'gpus', hash: sectionHash(this.options.hardware.gpus()) },
              { name: 'host', hash: sectionHash(this.hostSection()) },
            ],
          },
        },
      });
    });
  }

  private send(message: AgentMessage): void {
    if (this.silenced || !this.stream) return;
    this.stream.write(message);
  }

  private onMessage(message: ControlMessage): void {
    const body = message.body;
    if (!body) return;
    switch (body.$case) {
      case 'welcome': {
        this.status.connected = true;
        this.status.epoch = body.value.epoch;
        this.status.sessions++;
        this.writeSession();
        this.sendInventory(body.value.wantSections);
        this.options.selfUpdate?.afterWelcome(
          (status) => this.send({ body: { $case: 'updateStatus', value: status } }),
          () => this.closeStream(),
        );
        const interval = Math.max(100, body.value.heartbeatIntervalMs);
        this.heartbeat = setInterval(() => {
          this.send({
            body: {
              $case: 'heartbeat',
              value: { sentAtMs: Date.now(), observedGeneration: this.converger.generation },
            },
          });
        }, interval);
        return;
      }
      case 'spec': {
        const status = this.converger.onSpec(body.value);
        this.status.convergedGeneration = this.converger.generation;
        this.status.held = this.converger.heldAllocations();
        this.send({ body: { $case: 'specStatus', value: status } });
        return;
      }
      case 'command':
        this.onCommand(body.value);
        return;
      case 'inventoryRequest':
        this.sendInventory(body.value.sections);
        return;
      case 'refusal':
        this.options.log.warn({ refusal: body.value }, 'gateway refused a message');
        return;
      case 'reportAck':
      case 'heartbeatAck':
        return;
      default:
        assertNever(body);
    }
  }

  /** The host section: the hardware's, with the GPU resources another device plugin exposes. */
  private hostSection() {
    const foreign = this.devicePlugin?.foreignGpuResources() ?? [];
    return {
      ...this.options.hardware.host(),
      ...(foreign.length > 0 ? { foreignGpuResources: foreign } : {}),
    };
  }

  sendInventory(names: readonly string[]): void {
    const sections = [];
    for (const name of names) {
      const data =
        name === 'gpus' ? this.options.hardware.gpus() : name === 'host' ? this.hostSection() : null;
      if (!data) continue;
      sections.push({ name, hash: sectionHash(data), data: Buffer.from(JSON.stringify(data)) });
    }
    if (sections.length > 0) this.send({ body: { $case: 'inventory', value: { sections } } });
  }

  private onCommand(command: Command): void {
    const key = this.keyed ? (this.options.commandQueues?.key(command) ?? null) : null;
    if (this.keyed && key !== null) {
      this.keyed
        .run(key, () => this.execute(command))
        .catch((err: unknown) => this.options.log.warn({ err }, 'command failed'));
      return;
    }
    const previous = this.lanes.get(command.lane) ?? Promise.resolve();
    const next = previous.then(() => this.execute(command));
    this.lanes.set(
      command.lane,
      next.catch((err: unknown) => this.options.log.warn({ err }, 'command failed')),
    );
  }

  /** Runs one command under the journal and sends its result. */
  private async execute(command: Command): Promise<void> {
    if (this.stopped) return;
    const result = await runCommand(
      {
        hardware: this.options.hardware,
        journal: this.journal,
        heldGpus: () => this.converger.heldGpus(),
        resendInventory: () => this.sendInventory(['gpus', 'host']),
        reboot: () => this.closeStream(),
        ...(this.options.siteCommands ? { siteCommands: this.options.siteCommands } : {}),
        ...(this.options.ramdiskCommands ? { ramdiskCommands: this.options.ramdiskCommands } : {}),
        ...(this.options.selfUpdate ? { selfUpdate: this.options.selfUpdate } : {}),
      },
      command,
      Date.now(),
    );
    if (this.stopped) return;
    this.status.commandsRun++;
    this.send({ body: { $case: 'commandResult', value: result } });
  }
}
