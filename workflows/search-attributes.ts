import { defineSearchAttributeKey } from '@temporalio/common';

/**
 * Search attributes every reservation workflow carries, so an operator can filter the Temporal Web
 * UI: `ComputeTenant = "acme" AND ComputeState = "active"`. Registered when the dev server starts.
 */
export const searchAttributes = {
  tenant: defineSearchAttributeKey('ComputeTenant', 'KEYWORD'),
  pool: defineSearchAttributeKey('ComputePool', 'KEYWORD'),
  state: defineSearchAttributeKey('ComputeState', 'KEYWORD'),
  /** On a spot preemption's workflow: the regular reservation that preempts; on a BookingRepair: the one repaired. */
  reservation: defineSearchAttributeKey('ComputeReservation', 'KEYWORD'),
  /** On a rollout's workflow: its release, and its wave as `2/4` (state is `state`). */
  release: defineSearchAttributeKey('ComputeRelease', 'KEYWORD'),
  wave: defineSearchAttributeKey('ComputeWave', 'KEYWORD'),
  /** On a provisioning workflow (deploy, inspect): its machine, site, profile and current step. */
  node: defineSearchAttributeKey('ComputeNode', 'KEYWORD'),
  site: defineSearchAttributeKey('ComputeSite', 'KEYWORD'),
  profile: defineSearchAttributeKey('ComputeProfile', 'KEYWORD'),
  step: defineSearchAttributeKey('ComputeStep', 'KEYWORD'),
} as const;

/** The same keys in the CLI's `--search-attribute Name=Type` form. */
export const searchAttributeFlags = Object.values(searchAttributes).map((key) => `${key.name}=Keyword`);
