import { ComputeError } from './errors.ts';
import type { ProvisionState } from './fleet.ts';

/**
 * The one table of legal moves between provision states. Every verb and every provisioning
 * workflow that changes a node's `provision_state` checks its move here; an illegal move is
 * INVALID_STATE naming the current state. Maintenance is not a state: it is a flag beside any of
 * them (with its reason) that keeps the node out of placement.
 *
 * - `adopting`: a machine already running, taken over as it is (no wipe).
 * - `enrolling` → `inspecting` → `ready`: enrolled by its BMC, inspected over the ramdisk. A node
 *   that joins with bcd directly goes `enrolling` → `ready` once it reported its inventory.
 * - `ready` → `deploying` → `deployed`: a profile installed. A failed or aborted deploy runs its
 *   cleanup (`cleaning`) and comes back to `ready` in maintenance, never left half-way.
 * - `deployed` → `cleaning` → `ready`: released (the disk wiped by the ramdisk).
 * - any state → `retired` (a retired node is refused by the gateway and never comes back).
 */
export const provisionMoves = {
  adopting: ['ready', 'enrolling', 'retiring', 'retired'],
  enrolling: ['inspecting', 'ready', 'retiring', 'retired'],
  inspecting: ['ready', 'enrolling', 'retiring', 'retired'],
  available: ['ready', 'retiring', 'retired'],
  ready: ['inspecting', 'deploying', 'cleaning', 'retiring', 'retired'],
  deploying: ['deployed', 'cleaning', 'retired'],
  deployed: ['deploying', 'cleaning', 'retiring', 'retired'],
  cleaning: ['ready', 'retiring', 'retired'],
  retiring: ['retired'],
  retired: [],
} as const satisfies Record<ProvisionState, readonly ProvisionState[]>;

/** Whether `from` → `to` is a legal move (staying in the same state is not a move). */
export function isProvisionMove(from: ProvisionState, to: ProvisionState): boolean {
  return (provisionMoves[from] as readonly ProvisionState[]).includes(to);
}

/**
 * Throws INVALID_STATE naming the node's current state and what it may become when `from` → `to`
 * is not in the table. `verb` says what was asked (`metal.deploy`, `deploy workflow`).
 */
export function assertProvisionMove(
  nodeId: string,
  from: ProvisionState,
  to: ProvisionState,
  verb: string,
): void {
  if (isProvisionMove(from, to)) return;
  const next = provisionMoves[from] as readonly ProvisionState[];
  throw new ComputeError(
    'INVALID_STATE',
    `node ${nodeId} is ${from}: ${verb} needs it to become ${to}, and a ${from} node can only become ${next.length > 0 ? next.join(', ') : 'nothing (it is final)'}`,
    { provisionState: from, wanted: to, legal: [...next] },
  );
}

/** States in which a node may start a deploy (installing a profile). */
export const deployableStates = ['ready', 'deployed'] as const satisfies readonly ProvisionState[];
