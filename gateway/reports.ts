import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { decodeAllocationReport } from '../domain/attestation.ts';
import { ComputeError } from '../domain/errors.ts';
import type { AttestedReport } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

export const maxReportBytes = 16 * 1024;

/**
 * Stores a node's attested report as received and wakes the reservation's workflow. Accepts only
 * a report about an allocation placed on the reporting node, on the session that holds the node's
 * current epoch; a report about another node's allocation is answered like an unknown one
 * (NOT_FOUND). The signature is not judged here: the worker verifies it before a binding counts.
 */
export async function acceptAllocationReport(
  deps: { db: Db; log: Logger; lifecycle?: ReservationLifecycle },
  input: { nodeId: string; epoch: number; report: AttestedReport },
): Promise<{ allocationId: string; kind: 'bound' | 'failed' | 'released' }> {
  const { report } = input;
  if (report.body.length === 0 || report.body.length > maxReportBytes) {
    throw new ComputeError('INVALID_INPUT', 'report body is empty or larger than 16 KiB');
  }
  if (report.keyId.length > 128 || report.signature.length > 512) {
    throw new ComputeError('INVALID_INPUT', 'report key id or signature is oversized');
  }
  const body = decodeAllocationReport(report.body);
  if (!body?.kind || !body.allocationId) throw new ComputeError('INVALID_INPUT', 'malformed report');
  const kind = body.kind.$case;
  const allocationId = body.allocationId.slice(0, 100);
  const reservationId = await deps.db.transaction().execute(async (trx) => {
    const node = await trx
      .selectFrom('nodes')
      .where('id', '=', input.nodeId)
      .where('epoch', '=', String(input.epoch))
      .select('id')
      .forShare()
      .executeTakeFirst();
    if (!node) throw sessionFenced();
    const allocation = await trx
      .selectFrom('allocations')
      .where('id', '=', allocationId)
      .where('node_id', '=', input.nodeId)
      .select(['id', 'reservation_id', 'state'])
      .forUpdate()
      .executeTakeFirst();
    if (!allocation) throw new ComputeError('NOT_FOUND', `unknown allocation ${allocationId}`);
    if (kind === 'bound' && (allocation.state === 'released' || allocation.state === 'failed')) {
      throw new ComputeError('INVALID_STATE', `allocation ${allocationId} is ${allocation.state}`);
    }
    const signature = report.signature.length > 0 ? Buffer.from(report.signature) : null;
    const keyId = report.keyId.length > 0 ? report.keyId : null;
    await trx
      .insertInto('allocation_reports')
      .values({
        allocation_id: allocationId,
        node_id: input.nodeId,
        kind,
        epoch: input.epoch,
        report: Buffer.from(report.body),
        sig_kid: keyId,
        sig: signature,
      })
      .execute();
    if (kind === 'bound') {
      await trx
        .updateTable('allocations')
        .set({
          bound_report: Buffer.from(report.body),
          bound_sig_kid: keyId,
          bound_sig: signature,
          updated_at: sql<Date>`compute_now()`,
        })
        .where('id', '=', allocationId)
        .execute();
    }
    return allocation.reservation_id;
  });
  deps.log.info(
    { nodeId: input.nodeId, allocationId, kind, signed: report.signature.length > 0 },
    'allocation report stored',
  );
  if (reservationId && deps.lifecycle) {
    await deps.lifecycle
      .signal(reservationId, { type: 'allocationReport', allocationId, kind })
      .catch((err: unknown) =>
        deps.log.warn({ err, reservationId, allocationId }, 'lifecycle signal failed'),
      );
  }
  return { allocationId, kind };
}
