import { signDiscoveryAssertion } from '../domain/metal-discovery.ts';
import { keyIdOfPublicKey } from '../domain/pki.ts';
import type { ReclaimProof } from '../proto/gen/agent/v1/agent.ts';

/**
 * What a site agent's network boot server offers one machine: the ramdisk and, on its kernel
 * command line, the single-use discovery token a provisioning workflow minted for it. The
 * ramdisk asks the boot server to sign its join (`assert`): the site agent's key signs the
 * machine, the token, the boot lease epoch it serves under and the ramdisk's CSR.
 */
export interface PxeOffer {
  machineNodeId: string;
  discoveryToken: string;
  leaseEpoch: number;
  siteAgentNodeId: string;
  assert(csrPem: string): ReclaimProof;
}

/**
 * The boot network of a simulated site: site agents publish PXE offers by the machine's Redfish
 * system id (`bmc.boot` with `pxe`), and a simulated machine that powers on from the network takes
 * the offer for itself. One offer per machine: the newest replaces the rest.
 */
export class BootNetwork {
  private readonly offers = new Map<string, PxeOffer>();

  /** Called by the site agent that holds the boot lease, under the epoch it holds. */
  offer(
    systemId: string,
    input: { machineNodeId: string; discoveryToken: string; leaseEpoch: number },
    siteAgent: { nodeId: string; privateKeyPem: string; publicKeyPem: string },
  ): void {
    const tokenId = `dt_${/^bcdt_([0-9a-z]{26})\./.exec(input.discoveryToken)?.[1] ?? ''}`;
    this.offers.set(systemId, {
      ...input,
      siteAgentNodeId: siteAgent.nodeId,
      assert: (csrPem) => {
        const { signature } = signDiscoveryAssertion(
          { machineNodeId: input.machineNodeId, tokenId, leaseEpoch: input.leaseEpoch, csrPem },
          siteAgent.privateKeyPem,
        );
        return { nodeId: siteAgent.nodeId, keyId: keyIdOfPublicKey(siteAgent.publicKeyPem), signature };
      },
    });
  }

  /** What a machine booting from the network gets (undefined: no boot server offers it anything). */
  take(systemId: string): PxeOffer | undefined {
    return this.offers.get(systemId);
  }
}
