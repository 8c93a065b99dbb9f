import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { deleteRefusedReservations } from '../db/reservations/refused.ts';

export interface DraftCleanupActivityDeps {
  db: Db;
  log: Logger;
}

/**
 * The draft cleanup: what refused requests leave behind (drafts admission kept for a retry,
 * denials, expired confirmations) is removed once it is older than the retention, so clients
 * retrying with fresh keys against a full quota cannot grow the table without bound. Within the
 * retention a retry with the same key is still decided again (or answered its refusal).
 */
export function createDraftCleanupActivities({ db, log }: DraftCleanupActivityDeps) {
  return {
    /**
     * Removes one batch of at most `limit` refused reservations last touched more than
     * `retentionMs` ago, in one transaction; answers how many it removed (a full batch: run
     * again). Idempotent: a retry removes only what is still there and old enough.
     */
    async removeRefusedDrafts(input: { retentionMs: number; limit: number }): Promise<{ removed: number }> {
      const ids = await db.transaction().execute((trx) => deleteRefusedReservations(trx, input));
      if (ids.length > 0) log.info({ removed: ids.length }, 'removed refused requests past their retention');
      return { removed: ids.length };
    },
  };
}

export type DraftCleanupActivities = ReturnType<typeof createDraftCleanupActivities>;
