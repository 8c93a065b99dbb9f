import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { syncMachineDeploys } from '../db/metal/dedicated-leases.ts';
import { asActivity } from './failure.ts';

export interface MachineLeaseActivityDeps {
  db: Db;
  log: Logger;
}

/** The dedicated-root lease's own step in the reservation lifecycle (binding: 'node'). */
export function createMachineLeaseActivities({ db, log }: MachineLeaseActivityDeps) {
  return {
    /**
     * A binding lease looks at its deploys in one transaction (`syncMachineDeploys`): allocations
     * of deployed and joined machines bound, those of failed deploys failed with the reason.
     * Idempotent. Answers how many allocations changed (the lifecycle then looks again).
     */
    async syncMachineLease(input: { reservationId: string }): Promise<{ changed: number }> {
      return asActivity(async () => {
        const changed = await db.transaction().execute((trx) => syncMachineDeploys(trx, input.reservationId));
        if (changed > 0) log.info({ reservationId: input.reservationId, changed }, 'machine lease deploys');
        return { changed };
      });
    },
  };
}

export type MachineLeaseActivities = ReturnType<typeof createMachineLeaseActivities>;
