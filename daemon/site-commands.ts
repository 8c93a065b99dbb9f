import { assertNever } from '../domain/errors.ts';
import type { BmcPowerAction, BmcSystemView } from '../domain/metal-bmc.ts';
import { RedfishClient } from './redfish-client.ts';

/** The `bmc.*` command kinds, which only a site agent runs. */
export type SiteCommandKind = 'bmc.power' | 'bmc.boot' | 'bmc.media' | 'bmc.inventory';

export function isSiteCommandKind(kind: string): kind is SiteCommandKind {
  return kind === 'bmc.power' || kind === 'bmc.boot' || kind === 'bmc.media' || kind === 'bmc.inventory';
}

export interface SiteCommandOptions {
  /** Deadline of one Redfish request. */
  requestTimeoutMs?: number;
  /** How long a power change may take to show (real BMCs: seconds; the emulator: 1 to 11 s). */
  powerTimeoutMs?: number;
  /** How often a power change is polled for (one request each; default 1 s). */
  powerPollMs?: number;
  /**
   * The network boot server: with `bmc.boot` to `pxe` and a ramdisk to offer, it is published here
   * for the machine before the BMC is told to boot from the network.
   */
  pxe?: (
    systemId: string,
    offer: { machineNodeId: string; discoveryToken: string; leaseEpoch: number },
  ) => void;
}

/**
 * Runs one `bmc.*` command against the machine's BMC over Redfish. The payload was checked by its
 * kind's schema; `bmc.credential` is the password the gateway opened on this mutual-TLS stream.
 * Answers the system as the BMC reports it afterwards (power changes waited for). Throws on a BMC
 * that refuses or stops answering, which fails the command.
 */
export async function runSiteCommand(
  kind: SiteCommandKind,
  payload: Record<string, unknown>,
  options: SiteCommandOptions = {},
): Promise<{ machineNodeId: string; leaseEpoch: number; system: BmcSystemView }> {
  const bmc = payload.bmc as { address: string; systemId: string; username: string; credential: string };
  const client = new RedfishClient(
    { address: bmc.address, systemId: bmc.systemId, username: bmc.username, password: bmc.credential },
    options.requestTimeoutMs ?? 10_000,
  );
  const powerTimeoutMs = options.powerTimeoutMs ?? 60_000;
  const answer = (system: BmcSystemView) => ({
    machineNodeId: String(payload.machineNodeId),
    leaseEpoch: Number(payload.leaseEpoch),
    system,
  });
  switch (kind) {
    case 'bmc.power': {
      const action = payload.action as BmcPowerAction;
      await client.power(action);
      return answer(
        await client.waitForPower(action === 'off' ? 'off' : 'on', powerTimeoutMs, options.powerPollMs),
      );
    }
    case 'bmc.boot': {
      const ramdisk = payload.ramdisk as { discoveryToken: string } | undefined;
      if (payload.device === 'pxe' && ramdisk) {
        if (!options.pxe) throw new Error('this site agent serves no network boot (no PXE server)');
        options.pxe(bmc.systemId, {
          machineNodeId: String(payload.machineNodeId),
          discoveryToken: ramdisk.discoveryToken,
          leaseEpoch: Number(payload.leaseEpoch),
        });
      }
      await client.bootOnce(payload.device as 'pxe' | 'disk' | 'cd');
      return answer(await client.system());
    }
    case 'bmc.media':
      if (payload.action === 'insert') {
        if (typeof payload.imageUrl !== 'string') throw new Error('bmc.media insert needs imageUrl');
        await client.insertMedia(payload.imageUrl);
      } else {
        await client.ejectMedia();
      }
      return answer(await client.system());
    case 'bmc.inventory':
      return answer(await client.system());
    default:
      return assertNever(kind);
  }
}
