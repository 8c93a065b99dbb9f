import { z } from 'zod';
import type { CommandLane, NodeRole } from './fleet.ts';
import { bmcBootPayload, bmcInventoryPayload, bmcMediaPayload, bmcPowerPayload } from './metal-bmc.ts';
import {
  bootKexecPayload,
  deployImagePayload,
  diskWipePayload,
  logsCollectPayload,
} from './metal-commissioning.ts';
import { bcdRollbackPayloadSchema, bcdUpdatePayloadSchema } from './release-commands.ts';

/**
 * The registered command kinds: lane, the roles that accept them, a timeout, the payload schema and
 * their flags. Commands are actions; lasting state belongs in the NodeSpec.
 */
export interface CommandKind {
  lane: CommandLane;
  roles: readonly NodeRole[];
  timeoutMs: number;
  payload: z.ZodType<Record<string, unknown>>;
  /** Safe to run again after an interruption (the journal still never repeats a completed one). */
  retrySafe: boolean;
  destructive: boolean;
  /**
   * Queued only by the control plane itself (the metal API and deploy workflows), never by an
   * operator through `nodes.command`: a `bmc.*` payload carries a sealed credential and a boot
   * lease epoch that only the control plane can fill in.
   */
  controlPlaneOnly?: true;
  summary: string;
}

const gpuRoles = ['node', 'node-tenant'] as const satisfies readonly NodeRole[];

export const commandKinds = {
  'node.reboot': {
    lane: 'control',
    roles: ['node', 'node-tenant', 'site'],
    timeoutMs: 10 * 60_000,
    payload: z.strictObject({ reason: z.string().max(500).optional() }),
    retrySafe: false,
    destructive: true,
    summary: 'Reboot the machine (simulated: the agent drops its session and reconnects).',
  },
  'gpu.reset': {
    lane: 'control',
    roles: gpuRoles,
    timeoutMs: 2 * 60_000,
    payload: z.strictObject({ gpuUuid: z.string().min(1).max(200) }),
    retrySafe: false,
    destructive: true,
    summary: 'Reset one GPU that no allocation holds.',
  },
  'inventory.refresh': {
    lane: 'control',
    roles: ['node', 'node-tenant', 'site', 'ramdisk'],
    timeoutMs: 60_000,
    payload: z.strictObject({}),
    retrySafe: true,
    destructive: false,
    summary: 'Re-read the hardware and send every inventory section again.',
  },
  'diag.nvml': {
    lane: 'bulk',
    roles: [...gpuRoles, 'ramdisk'],
    timeoutMs: 5 * 60_000,
    payload: z.strictObject({ level: z.enum(['quick', 'full']).default('quick') }),
    retrySafe: true,
    destructive: false,
    summary: 'Run GPU diagnostics and return per-GPU results.',
  },
  // The site agent's own kinds: a BMC over Redfish, under the site's boot lease epoch.
  'bmc.power': {
    lane: 'provision',
    roles: ['site'],
    timeoutMs: 2 * 60_000,
    payload: bmcPowerPayload,
    controlPlaneOnly: true,
    retrySafe: true,
    destructive: true,
    summary: 'Power a bare machine on, off or reset it through its BMC (Redfish), from the site agent.',
  },
  'bmc.boot': {
    lane: 'provision',
    roles: ['site'],
    timeoutMs: 60_000,
    payload: bmcBootPayload,
    controlPlaneOnly: true,
    retrySafe: true,
    destructive: false,
    summary: 'Set the one-time boot device (pxe, disk or cd) of a bare machine through its BMC.',
  },
  'bmc.media': {
    lane: 'provision',
    roles: ['site'],
    timeoutMs: 5 * 60_000,
    payload: bmcMediaPayload,
    controlPlaneOnly: true,
    retrySafe: true,
    destructive: false,
    summary: "Insert or eject the virtual CD of a bare machine's BMC.",
  },
  'bmc.inventory': {
    lane: 'provision',
    roles: ['site'],
    timeoutMs: 60_000,
    payload: bmcInventoryPayload,
    controlPlaneOnly: true,
    retrySafe: true,
    destructive: false,
    summary:
      "Read a bare machine's system inventory (power, boot override, NICs, virtual media) from its BMC.",
  },
  // The ramdisk's commissioning kinds (role ramdisk only: a ramdisk accepts nothing else but
  // inventory.refresh and diag.*).
  'disk.wipe': {
    lane: 'provision',
    roles: ['ramdisk'],
    timeoutMs: 30 * 60_000,
    payload: diskWipePayload,
    retrySafe: true,
    destructive: true,
    summary: "Wipe the machine's disks from the ramdisk.",
  },
  'deploy.image': {
    lane: 'provision',
    roles: ['ramdisk'],
    timeoutMs: 60 * 60_000,
    payload: deployImagePayload,
    controlPlaneOnly: true,
    retrySafe: true,
    destructive: true,
    summary:
      'Stream an image to the disk (its SHA-256 checked while streaming) and write the first-boot configuration.',
  },
  'boot.kexec': {
    lane: 'provision',
    roles: ['ramdisk'],
    timeoutMs: 5 * 60_000,
    payload: bootKexecPayload,
    retrySafe: false,
    destructive: true,
    summary: 'Boot the deployed system from the ramdisk without a power cycle (kexec).',
  },
  'logs.collect': {
    lane: 'bulk',
    roles: ['ramdisk'],
    timeoutMs: 5 * 60_000,
    payload: logsCollectPayload,
    retrySafe: true,
    destructive: false,
    summary: "Collect the ramdisk's logs (kernel, hardware, the last commissioning commands).",
  },
  'bcd.update': {
    lane: 'control',
    roles: gpuRoles,
    timeoutMs: 10 * 60_000,
    payload: bcdUpdatePayloadSchema,
    retrySafe: false,
    destructive: false,
    summary:
      'Verify a signed release (signatures against bcd’s own pins, every file’s digest), stage it in the inactive slot and restart into it; bcd rolls back by itself when the new version fails its health check.',
  },
  'bcd.rollback': {
    lane: 'control',
    roles: gpuRoles,
    timeoutMs: 10 * 60_000,
    payload: bcdRollbackPayloadSchema,
    retrySafe: false,
    destructive: false,
    summary: 'Restart bcd into its previous slot (the version it ran before the last update).',
  },
} as const satisfies Record<string, CommandKind>;

export type CommandKindName = keyof typeof commandKinds;
export const commandKindNames = Object.keys(commandKinds) as CommandKindName[];

/** The kinds an operator may queue by hand (`nodes.command`): all but the control plane's own. */
export const operatorCommandKindNames = commandKindNames.filter(
  (name) => !(commandKinds[name] as CommandKind).controlPlaneOnly,
);

export function isCommandKind(kind: string): kind is CommandKindName {
  return Object.hasOwn(commandKinds, kind);
}
