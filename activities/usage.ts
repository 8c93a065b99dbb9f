import type { Db } from '../core/database.ts';
import type { IamPort } from '../core/iam-port.ts';
import type { Logger } from '../core/logger.ts';
import { markUsageSent, meterReservationUsage, unsentUsage } from '../db/reservations/usage.ts';

export interface UsageActivityDeps {
  db: Db;
  log: Logger;
  iam: Pick<IamPort, 'recordUsage'>;
}

/**
 * Billing. Metering writes closed usage windows (per allocation, hour and meter) in one
 * transaction; sending hands the unsent ones to the IAM billing ledger with their idempotency keys
 * (outside any transaction) and then marks them sent, so a retry after a crash re-sends the same
 * keys and the ledger counts each window once.
 */
export function createUsageActivities({ db, log, iam }: UsageActivityDeps) {
  return {
    /** Writes the reservation's closed usage windows; answers how many were new. */
    async meterUsage(input: { reservationId: string; windowMs: number }): Promise<{ written: number }> {
      const written = await db
        .transaction()
        .execute((trx) => meterReservationUsage(trx, input.reservationId, input.windowMs));
      return { written };
    },

    /** Sends unsent windows to billing (idempotent by key) and marks them sent. */
    async sendUsage(input: { reservationId: string; windowMs: number }): Promise<{ sent: number }> {
      const records = await unsentUsage(db, input.reservationId, input.windowMs);
      if (records.length === 0) return { sent: 0 };
      await iam.recordUsage(records);
      await markUsageSent(
        db,
        records.map((r) => r.idempotencyKey),
      );
      log.info({ reservationId: input.reservationId, windows: records.length }, 'usage sent to billing');
      return { sent: records.length };
    },
  };
}

export type UsageActivities = ReturnType<typeof createUsageActivities>;
