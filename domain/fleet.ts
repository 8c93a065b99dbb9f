/**
 * The fleet's closed sets, one `as const` table each: the schema types, the API schemas and every
 * switch over them import these (a new member is added here and nowhere else).
 */

export const poolSharingModes = ['exclusive', 'mig', 'time-slice', 'mps'] as const;
export type PoolSharingMode = (typeof poolSharingModes)[number];

export const poolClasses = ['metal-host', 'metal-dedicated', 'vps-host', 'provider'] as const;
export type PoolClass = (typeof poolClasses)[number];

export const provisionStates = [
  'adopting',
  'enrolling',
  'inspecting',
  'available',
  'ready',
  'deploying',
  'deployed',
  'cleaning',
  'retiring',
  'retired',
] as const;
export type ProvisionState = (typeof provisionStates)[number];

export const connectivities = ['connected', 'unreachable', 'unknown'] as const;
export type Connectivity = (typeof connectivities)[number];

export const nodeRoles = ['node', 'node-tenant', 'site', 'ramdisk'] as const;
export type NodeRole = (typeof nodeRoles)[number];

export const deviceClasses = ['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'] as const;
export type DeviceClass = (typeof deviceClasses)[number];

export const hostResources = ['vcpu', 'memoryGiB', 'hugepages2Mi', 'hugepages1Gi'] as const;
export type HostResource = (typeof hostResources)[number];

export const allocationStates = ['planned', 'binding', 'bound', 'releasing', 'released', 'failed'] as const;
export type AllocationState = (typeof allocationStates)[number];

/** Allocations that are over: their bookings no longer hold anything, they count nowhere. */
export const endedAllocationStates = ['released', 'failed'] as const satisfies readonly AllocationState[];

/** Allocations that hold their devices on the node, from placement until a release starts. */
export const holdingAllocationStates = [
  'planned',
  'binding',
  'bound',
] as const satisfies readonly AllocationState[];

/** Whether an allocation in `state` still holds its devices (`holdingAllocationStates`). */
export function isHoldingAllocation(state: AllocationState): boolean {
  return (holdingAllocationStates as readonly AllocationState[]).includes(state);
}

export const commandLanes = ['control', 'provision', 'bulk'] as const;
export type CommandLane = (typeof commandLanes)[number];

export const commandStates = [
  'queued',
  'delivered',
  'running',
  'succeeded',
  'failed',
  'expired',
  'cancelled',
] as const;
export type CommandState = (typeof commandStates)[number];

/** Commands handed to the node and not finished yet: only the node can still answer them. */
export const inFlightCommandStates = ['delivered', 'running'] as const satisfies readonly CommandState[];
