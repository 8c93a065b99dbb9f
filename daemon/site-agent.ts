import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import type { Command } from '../proto/gen/agent/v1/agent.ts';
import { agentVersion, NodeAgent } from './agent.ts';
import type { BootNetwork } from './boot-network.ts';
import type { Hardware } from './hardware.ts';
import { identityExists, joinWithToken, loadIdentity, type NodeIdentity } from './identity.ts';
import { isSiteCommandKind, runSiteCommand, type SiteCommandOptions } from './site-commands.ts';

export const defaultBmcConcurrency = 16;

/**
 * The queue a site agent runs a command in: one per machine for the `bmc.*` kinds (so different
 * machines' BMCs are driven side by side), null (its lane, in order) for anything else.
 */
export function machineQueueOf(command: Command): string | null {
  if (!isSiteCommandKind(command.kind)) return null;
  try {
    const payload = JSON.parse(command.payloadJson.toString('utf8') || '{}') as { machineNodeId?: unknown };
    return typeof payload.machineNodeId === 'string' ? `machine:${payload.machineNodeId}` : null;
  } catch {
    return null; // refused by runCommand as a bad payload, in its lane
  }
}

export interface SiteAgentOptions {
  gatewayAddress: string;
  caCertificatePem: string;
  /** A site join token (`bcst_…`); not needed when `dir` already holds an identity. */
  token?: string;
  dir: string;
  name: string;
  /** What the agent's own machine reports (a real host, or `SimHardware` without GPUs). */
  hardware: Hardware;
  log: Logger;
  redfish?: SiteCommandOptions;
  /**
   * BMC commands run at once, for different machines (default 16); one machine's commands always
   * run one after another, in the order they were sent.
   */
  bmcConcurrency?: number;
  /** The boot network its PXE server offers ramdisks on (simulated sites: `BootNetwork`). */
  bootNetwork?: BootNetwork;
  minBackoffMs?: number;
  maxBackoffMs?: number;
}

export interface StartedSiteAgent {
  identity: NodeIdentity;
  agent: NodeAgent;
  stop(): Promise<void>;
}

/**
 * `bcd site`: the site agent. It joins its site once with a site token (role `site`), then holds
 * one session like any agent; the gateway gives the site's boot lease (`site:<id>:boot`) to one
 * connected site agent at a time and sends the `bmc.*` commands to the holder only, which runs
 * them against the machines' BMCs over Redfish: up to `bmcConcurrency` machines at once, each
 * machine's commands in order. Any number of standbys may run; one takes over
 * under a new epoch when the holder's lease expires.
 */
export async function startSiteAgent(options: SiteAgentOptions): Promise<StartedSiteAgent> {
  let identity: NodeIdentity;
  if (identityExists(options.dir)) {
    identity = { ...loadIdentity(options.dir), gateway: options.gatewayAddress };
  } else {
    if (!options.token) throw new Error(`no identity in ${options.dir}: give a site join token (--token)`);
    identity = await joinWithToken({
      gateway: options.gatewayAddress,
      token: options.token,
      caCertificatePem: options.caCertificatePem,
      dir: options.dir,
      evidence: options.hardware.evidence(),
      requestedName: options.name,
      agentVersion,
    });
  }
  const log = options.log.child({ nodeId: identity.nodeId, siteAgent: identity.nodeName });
  const agent = new NodeAgent({
    identity,
    stateDir: options.dir,
    roots: { cdiDir: path.join(options.dir, 'cdi'), envDir: path.join(options.dir, 'allocations') },
    hardware: options.hardware,
    log,
    commandQueues: { key: machineQueueOf, concurrency: options.bmcConcurrency ?? defaultBmcConcurrency },
    siteCommands: async (kind, payload) => {
      const network = options.bootNetwork;
      const answer = await runSiteCommand(kind, payload, {
        ...options.redfish,
        ...(network
          ? {
              pxe: (systemId, offer) =>
                network.offer(systemId, offer, {
                  nodeId: identity.nodeId,
                  privateKeyPem: identity.privateKeyPem,
                  publicKeyPem: identity.publicKeyPem,
                }),
            }
          : {}),
      });
      log.info(
        {
          kind,
          machineNodeId: answer.machineNodeId,
          leaseEpoch: answer.leaseEpoch,
          power: answer.system.redfishPowerState,
          boot: answer.system.bootOverride,
        },
        'BMC command done',
      );
      return answer;
    },
    ...(options.minBackoffMs !== undefined ? { minBackoffMs: options.minBackoffMs } : {}),
    ...(options.maxBackoffMs !== undefined ? { maxBackoffMs: options.maxBackoffMs } : {}),
  });
  agent.start();
  log.info({ gateway: identity.gateway, siteId: identity.siteId }, 'site agent running');
  return { identity, agent, stop: () => agent.stop() };
}
