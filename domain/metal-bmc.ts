import { z } from 'zod';

/**
 * What the control plane asks of a BMC, through the site agent only. The closed sets and the
 * payload schemas of the `bmc.*` command kinds live here; `domain/command-kinds.ts` registers them.
 */

export const bmcPowerActions = ['on', 'off', 'reset'] as const;
export type BmcPowerAction = (typeof bmcPowerActions)[number];

/** One-time boot devices: network (PXE), the local disk, or the virtual CD (virtual media). */
export const bmcBootDevices = ['pxe', 'disk', 'cd'] as const;
export type BmcBootDevice = (typeof bmcBootDevices)[number];

/** Redfish's names for them (ComputerSystem.Boot.BootSourceOverrideTarget). */
export const redfishBootTargets: Record<BmcBootDevice, string> = { pxe: 'Pxe', disk: 'Hdd', cd: 'Cd' };

/** Redfish's reset types (ComputerSystem.Reset). */
export const redfishResetTypes: Record<BmcPowerAction, string> = {
  on: 'On',
  off: 'ForceOff',
  reset: 'ForceRestart',
};

/** Reads a Redfish BootSourceOverrideTarget back into ours (null: one we do not name). */
export function bootDeviceFromRedfish(target: string | null | undefined): BmcBootDevice | null {
  for (const [device, name] of Object.entries(redfishBootTargets)) {
    if (name === target) return device as BmcBootDevice;
  }
  return null;
}

/** A Redfish PowerState read back into the node's power axis. */
export function powerStateFromRedfish(state: string | null | undefined): 'on' | 'off' | 'unknown' {
  if (state === 'On' || state === 'PoweringOff') return 'on';
  if (state === 'Off' || state === 'PoweringOn') return 'off';
  return 'unknown';
}

/**
 * A BMC's address: an http(s) URL of a host (name, IPv4 or [IPv6]) and optional port, without
 * credentials, path, query or fragment. A pattern, not a refinement, so the OpenAPI document
 * states it.
 */
export const bmcAddressSchema = z
  .string()
  .max(300)
  .regex(
    /^https?:\/\/([A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?\/?$/,
    'a BMC address such as https://10.0.0.5 (scheme, host and port only, no credentials)',
  );

/**
 * An http(s) URL a BMC or a ramdisk fetches (virtual media, images): a host, an optional port and
 * a path of URL-safe characters. A pattern, so the OpenAPI document states it.
 */
export const fetchUrlSchema = z
  .string()
  .max(2000)
  .regex(
    /^https?:\/\/([A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?(\/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?$/,
    'an http(s) URL such as http://10.0.0.2/images/ubuntu.raw',
  );

/**
 * The BMC a `bmc.*` command addresses. `credential` is the password sealed with the deployment
 * secret while stored; the gateway opens it only on the mutual-TLS stream to the site agent.
 */
export const bmcTargetSchema = z.strictObject({
  address: z.string().min(1).max(300),
  systemId: z.string().min(1).max(200),
  username: z.string().min(1).max(200),
  credential: z.string().min(1).max(4000),
});
export type BmcTarget = z.infer<typeof bmcTargetSchema>;

/** Every `bmc.*` payload names the machine, its BMC and the boot lease epoch it was sent under. */
const bmcCommon = {
  machineNodeId: z.string().min(1).max(100),
  leaseEpoch: z.number().int().min(1),
  bmc: bmcTargetSchema,
};

export const bmcPowerPayload = z.strictObject({ ...bmcCommon, action: z.enum(bmcPowerActions) });
export const bmcBootPayload = z.strictObject({
  ...bmcCommon,
  device: z.enum(bmcBootDevices),
  /**
   * With `pxe`: what the site agent's boot server hands the ramdisk it network-boots for this
   * machine: a single-use discovery token; the agent adds its signed assertion at the join.
   */
  ramdisk: z.strictObject({ discoveryToken: z.string().max(200) }).optional(),
});
export const bmcMediaPayload = z.strictObject({
  ...bmcCommon,
  action: z.enum(['insert', 'eject']),
  imageUrl: fetchUrlSchema.optional(),
});
export const bmcInventoryPayload = z.strictObject(bmcCommon);

/** What every `bmc.*` command answers: the system as the BMC reports it after the action. */
export interface BmcSystemView {
  systemId: string;
  name: string | null;
  uuid: string | null;
  powerState: 'on' | 'off' | 'unknown';
  /** The raw Redfish PowerState (a change is applied by the BMC some seconds later). */
  redfishPowerState: string | null;
  bootDevice: BmcBootDevice | null;
  bootOverride: string | null;
  macs: string[];
  virtualMedia: Array<{ id: string; inserted: boolean; image: string | null }>;
}
