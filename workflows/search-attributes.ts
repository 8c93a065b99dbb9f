import { defineSearchAttributeKey } from '@temporalio/common';

/**
 * Search attributes every reservation workflow carries, so an operator can filter the Temporal Web
 * UI: `ComputeTenant = "acme" AND ComputeState = "active"`. Registered when the dev server starts.
 */
export const searchAttributes = {
  tenant: defineSearchAttributeKey('ComputeTenant', 'KEYWORD'),
  pool: defineSearchAttributeKey('ComputePool', 'KEYWORD'),
  state: defineSearchAttributeKey('ComputeState', 'KEYWORD'),
} as const;

/** The same keys in the CLI's `--search-attribute Name=Type` form. */
export const searchAttributeFlags = Object.values(searchAttributes).map((key) => `${key.name}=Keyword`);
