import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import type { BcdUpdateState } from '../../domain/release-commands.ts';

/**
 * What bcd says about itself, as the health gate of a rollout reads it: the session protocol it
 * declared, its health after restarting into a new slot, and its last update report, each stamped
 * with the session epoch it came in (a report of an older session never passes a newer gate). The
 * protocol version is written where the session opens (`openNodeSession` in db/nodes/sessions.ts).
 */

/**
 * Stores one UpdateStatus of the session holding `epoch`: `healthy`/`unhealthy` set the node's bcd
 * health in that epoch; every state becomes the node's last update report. Answers false (nothing
 * written) when a newer session fenced this one.
 */
export async function recordBcdUpdateStatus(
  db: Db,
  fence: { nodeId: string; epoch: number },
  status: { releaseId: string; version: string; state: BcdUpdateState; message: string },
): Promise<boolean> {
  const health = status.state === 'healthy' || status.state === 'unhealthy' ? status.state : null;
  const result = await db
    .updateTable('nodes')
    .set({
      ...(health ? { bcd_health: health, bcd_health_epoch: fence.epoch } : {}),
      bcd_update_report: JSON.stringify({
        ...status,
        releaseId: status.releaseId || null,
        epoch: fence.epoch,
      }),
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', fence.nodeId)
    .where('epoch', '=', String(fence.epoch))
    .executeTakeFirst();
  return Number(result.numUpdatedRows) > 0;
}
