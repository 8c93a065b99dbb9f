import type { Db } from '../core/database.ts';
import {
  type AppliedInventory,
  applyNodeInventory,
  type NodeInventorySections,
} from '../db/nodes/inventory.ts';
import { ComputeError } from '../domain/errors.ts';
import { inventorySections, isInventorySectionName, sectionHash } from '../domain/inventory-sections.ts';
import type { InventorySection } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

/** Validates sections before anything is written: unknown names, bad JSON or a wrong hash refuse all. */
export function parseInventory(sections: readonly InventorySection[]): NodeInventorySections {
  const out: NodeInventorySections = {};
  for (const section of sections) {
    if (!isInventorySectionName(section.name)) {
      throw new ComputeError('INVALID_INPUT', `unknown inventory section ${section.name.slice(0, 50)}`);
    }
    let json: unknown;
    try {
      json = JSON.parse(Buffer.from(section.data).toString('utf8'));
    } catch {
      throw new ComputeError('INVALID_INPUT', `inventory section ${section.name} is not JSON`);
    }
    const parsed = inventorySections[section.name].safeParse(json);
    if (!parsed.success) {
      throw new ComputeError(
        'INVALID_INPUT',
        `inventory section ${section.name}: ${parsed.error.issues[0]?.message}`,
      );
    }
    if (sectionHash(parsed.data) !== section.hash) {
      throw new ComputeError('INVALID_INPUT', `inventory section ${section.name} does not match its hash`);
    }
    (out as Record<string, unknown>)[section.name] = parsed.data;
  }
  return out;
}

/**
 * Turns inventory into devices, host resource rows, labels and conditions, and makes a joined node
 * that converged its spec `ready`, in one transaction fenced by the session's epoch (a fenced
 * session changes nothing: INVALID_STATE). Answers the live reservations on the node.
 */
export async function applyInventory(
  db: Db,
  input: { nodeId: string; epoch: number; sections: NodeInventorySections },
): Promise<AppliedInventory> {
  return db.transaction().execute(async (trx) => {
    const applied = await applyNodeInventory(trx, input, input.sections);
    if (!applied) throw sessionFenced();
    return applied;
  });
}
