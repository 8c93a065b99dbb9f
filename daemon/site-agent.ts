import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import { agentVersion, NodeAgent } from './agent.ts';
import type { BootNetwork } from './boot-network.ts';
import type { Hardware } from './hardware.ts';
import { identityExists, joinWithToken, loadIdentity, type NodeIdentity } from './identity.ts';
import { runSiteCommand, type SiteCommandOptions } from './site-commands.ts';

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
 * them against the machines' BMCs over Redfish. Any number of standbys may run; one takes over
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
