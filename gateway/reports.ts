import { waitAtMost } from '../core/bounded-wait.ts';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { storeAllocationReport } from '../db/allocations/reports.ts';
import { lockNodeAtEpoch } from '../db/nodes/sessions.ts';
import { decodeAllocationReport } from '../domain/attestation.ts';
import { ComputeError } from '../domain/errors.ts';
import type { AttestedReport } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

export const maxReportBytes = 16 * 1024;

/**
 * Stores a node's attested report as received and wakes the reservation's workflow. Accepts only
 * a report that names the reporting node, about an allocation placed on it, on the session that
 * holds the node's current epoch; a report about another node's allocation (whatever its tenant)
 * is answered like an unknown one (NOT_FOUND) and one naming another node is INVALID_INPUT, both
 * changing nothing. The signature is not judged here: the worker verifies it before a binding
 * counts.
 */
/** How long a report's ack waits for the lifecycle's wake-up after the report is stored. */
export const reportSignalWaitMs = 1_000;

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
  // A node speaks only for itself: a report naming another node never reaches the database.
  if (body.nodeId !== input.nodeId) {
    throw new ComputeError('INVALID_INPUT', 'the report names another node than the session’s');
  }
  if (body.allocationId.length > 100) throw new ComputeError('INVALID_INPUT', 'malformed report');
  const kind = body.kind.$case;
  const allocationId = body.allocationId;
  const { reservationId } = await deps.db.transaction().execute(async (trx) => {
    if (!(await lockNodeAtEpoch(trx, input, 'share'))) throw sessionFenced();
    return storeAllocationReport(trx, {
      nodeId: input.nodeId,
      epoch: input.epoch,
      allocationId,
      kind,
      body: report.body,
      keyId: report.keyId.length > 0 ? report.keyId : null,
      signature: report.signature.length > 0 ? report.signature : null,
    });
  });
  deps.log.info(
    { nodeId: input.nodeId, allocationId, kind, signed: report.signature.length > 0 },
    'allocation report stored',
  );
  if (reservationId && deps.lifecycle) {
    // The report is stored: the node's ack never waits on a Temporal that is down for longer than
    // reportSignalWaitMs. A lifecycle that misses the wake-up judges stored reports at its next look.
    const signalled = deps.lifecycle
      .signal(reservationId, { type: 'allocationReport', allocationId, kind })
      .catch((err: unknown) =>
        deps.log.warn({ err, reservationId, allocationId }, 'lifecycle signal failed'),
      );
    await waitAtMost(signalled, reportSignalWaitMs);
  }
  return { allocationId, kind };
}
