import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { type AttestationVerdict, verifyAttestedReport } from '../../domain/attestation.ts';
import { ComputeError } from '../../domain/errors.ts';
import { isHoldingAllocation } from '../../domain/fleet.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { findAttestationCertificates } from '../nodes/certificates.ts';

type Trx = Transaction<Database>;

export interface ReportJudgement {
  allocationId: string;
  reservationId: string | null;
  nodeId: string;
  /** The kind of the latest stored report, or null when the node never reported. */
  kind: 'bound' | 'failed' | 'released' | null;
  verdict: AttestationVerdict | null;
  /** What the judgement did to the allocation. */
  outcome:
    | 'bound'
    | 'failed'
    | 'released'
    | 'rejected'
    | 'binding-lost'
    | 'restored'
    | 'unchanged'
    | 'no-report';
}

/**
 * The worker's check of an allocation's latest stored report (the gateway stores them as
 * received), in the caller's transaction, under the allocation's row lock. A report counts only
 * when `verifyAttestedReport` accepts it: signed by a current, unrevoked certificate of the
 * allocation's node whose role runs workloads, naming exactly this allocation and, for a binding,
 * exactly its booked GPUs. Then:
 *
 * - `bound`: the allocation becomes `bound` with the signed CDI devices and env file, `attested`,
 *   `bound_at` kept from the first binding (billing starts there);
 * - `failed` / `released`: the allocation takes that state if it was still live.
 *
 * A report that fails the check changes no binding: a `binding` allocation has `bound_at` cleared
 * (nothing is billed) and waits for a genuine report or its bind timeout; a `bound` one answers
 * `binding-lost` (the caller sets `Degraded`/`BindingLost`). Every rejection writes
 * `reservation.binding-rejected` with `allocationId`, `nodeId` and `reason`. Idempotent: judging
 * the same report again changes nothing further (the event is written once per report).
 */
export async function judgeAllocationReport(trx: Trx, allocationId: string): Promise<ReportJudgement> {
  const allocation = await trx
    .selectFrom('allocations as a')
    .leftJoin('reservations as r', 'r.id', 'a.reservation_id')
    .select([
      'a.id',
      'a.node_id',
      'a.reservation_id',
      'a.state',
      'a.bound_at',
      'a.binding_lost_at',
      'r.tenant_id',
      'r.pool_id',
    ])
    .where('a.id', '=', allocationId)
    .forUpdate('a')
    .executeTakeFirstOrThrow();
  const base = { allocationId, reservationId: allocation.reservation_id, nodeId: allocation.node_id };
  const report = await trx
    .selectFrom('allocation_reports')
    .selectAll()
    .where('allocation_id', '=', allocationId)
    .where('node_id', '=', allocation.node_id)
    .orderBy('id', 'desc')
    .limit(1)
    .executeTakeFirst();
  if (!report) return { ...base, kind: null, verdict: null, outcome: 'no-report' };
  const uuids = await trx
    .selectFrom('device_bookings as b')
    .innerJoin('devices as d', 'd.id', 'b.device_id')
    .select('d.stable_id')
    .where('b.allocation_id', '=', allocationId)
    .execute();
  const certificates = report.sig_kid ? await findAttestationCertificates(trx, report.sig_kid) : [];
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
  const verdict = verifyAttestedReport({
    body: report.report,
    keyId: report.sig_kid,
    signature: report.sig,
    allocationId,
    nodeId: allocation.node_id,
    certificates,
    now: rows[0]!.now,
    kind: report.kind,
    ...(report.kind === 'bound' && uuids.length > 0
      ? { expectedGpuUuids: uuids.map((u) => u.stable_id) }
      : {}),
  });
  // A releasing allocation (a kubernetes binding whose pods held its GPUs) ends with the node's
  // report that they are free: billing stops there (`released_at`).
  const live =
    isHoldingAllocation(allocation.state) || (allocation.state === 'releasing' && report.kind === 'released');
  // A bound allocation the node says it can no longer honour (a GPU fell off, host admission) is
  // not failed: it keeps its booking and the reservation shows Degraded/BindingLost until the
  // node reports it bound again (principle 7: nothing is released for node trouble).
  if (verdict.ok && report.kind === 'failed' && allocation.state === 'bound') {
    return { ...base, kind: 'failed', verdict, outcome: 'binding-lost' };
  }
  if (verdict.ok && report.kind !== 'bound') {
    if (live) {
      await trx
        .updateTable('allocations')
        .set({
          state: report.kind,
          updated_at: sql<Date>`compute_now()`,
          ...(report.kind === 'released' ? { released_at: sql<Date>`compute_now()` } : {}),
        })
        .where('id', '=', allocationId)
        .execute();
    }
    return { ...base, kind: report.kind, verdict, outcome: live ? report.kind : 'unchanged' };
  }
  if (verdict.ok && verdict.binding) {
    if (allocation.state === 'bound' && allocation.binding_lost_at && allocation.reservation_id) {
      // The node reports the allocation bound again, genuinely: the lost binding is restored.
      await trx
        .updateTable('allocations')
        .set({
          binding_lost_at: null,
          binding: JSON.stringify({
            nodeId: allocation.node_id,
            cdiDevices: verdict.binding.cdiDevices,
            envFile: verdict.binding.envFile,
            ...(verdict.binding.cgroupParent ? { cgroupParent: verdict.binding.cgroupParent } : {}),
          }),
          updated_at: sql<Date>`compute_now()`,
        })
        .where('id', '=', allocationId)
        .execute();
      await insertOutboxEvent(trx, {
        type: 'reservation.binding-restored',
        subject: `reservation/${allocation.reservation_id}`,
        tenantId: allocation.tenant_id,
        data: {
          reservationId: allocation.reservation_id,
          allocationId,
          nodeId: allocation.node_id,
          reportId: String(report.id),
          poolId: allocation.pool_id,
        },
      });
      return { ...base, kind: 'bound', verdict, outcome: 'restored' };
    }
    if (!live || allocation.state === 'bound')
      return { ...base, kind: 'bound', verdict, outcome: 'unchanged' };
    await trx
      .updateTable('allocations')
      .set({
        state: 'bound',
        attested: true,
        bound_at: sql<Date>`COALESCE(bound_at, compute_now())`,
        binding: JSON.stringify({
          nodeId: allocation.node_id,
          cdiDevices: verdict.binding.cdiDevices,
          envFile: verdict.binding.envFile,
          ...(verdict.binding.cgroupParent ? { cgroupParent: verdict.binding.cgroupParent } : {}),
        }),
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', allocationId)
      .execute();
    return { ...base, kind: 'bound', verdict, outcome: 'bound' };
  }
  const reason = verdict.ok ? '' : verdict.reason;
  const already = await trx
    .selectFrom('outbox_events')
    .select('id')
    .where('type', '=', 'reservation.binding-rejected')
    .where(sql<boolean>`data->>'reportId' = ${String(report.id)}`)
    .executeTakeFirst();
  if (!already && allocation.reservation_id) {
    await insertOutboxEvent(trx, {
      type: 'reservation.binding-rejected',
      subject: `reservation/${allocation.reservation_id}`,
      tenantId: allocation.tenant_id,
      data: {
        reservationId: allocation.reservation_id,
        allocationId,
        nodeId: allocation.node_id,
        reason,
        reportId: String(report.id),
        poolId: allocation.pool_id,
      },
    });
  }
  if (allocation.state === 'bound') {
    return { ...base, kind: report.kind, verdict, outcome: 'binding-lost' };
  }
  if (allocation.bound_at) {
    await trx.updateTable('allocations').set({ bound_at: null }).where('id', '=', allocationId).execute();
  }
  return { ...base, kind: report.kind, verdict, outcome: 'rejected' };
}

/**
 * Stores a node's attested report as received (not judged: `judgeAllocationReport` does that in
 * the worker), in the caller's transaction, under the allocation's row lock. Only a report about
 * an allocation placed on the reporting node counts: another node's allocation answers like an
 * unknown one (NOT_FOUND); a binding report for a released or failed allocation is INVALID_STATE.
 * A binding report is also kept on the allocation. Answers the allocation's reservation.
 */
export async function storeAllocationReport(
  trx: Trx,
  input: {
    nodeId: string;
    epoch: number;
    allocationId: string;
    kind: 'bound' | 'failed' | 'released';
    body: Uint8Array;
    keyId: string | null;
    signature: Uint8Array | null;
  },
): Promise<{ reservationId: string | null }> {
  const { allocationId, kind } = input;
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
  const signature = input.signature ? Buffer.from(input.signature) : null;
  await trx
    .insertInto('allocation_reports')
    .values({
      allocation_id: allocationId,
      node_id: input.nodeId,
      kind,
      epoch: input.epoch,
      report: Buffer.from(input.body),
      sig_kid: input.keyId,
      sig: signature,
    })
    .execute();
  if (kind === 'bound') {
    await trx
      .updateTable('allocations')
      .set({
        bound_report: Buffer.from(input.body),
        bound_sig_kid: input.keyId,
        bound_sig: signature,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', allocationId)
      .execute();
  }
  return { reservationId: allocation.reservation_id };
}

/**
 * Judges (judgeAllocationReport) the latest stored report of every allocation of the
 * reservation's current placement that has one, in id order, in the caller's transaction; a bound
 * allocation whose later report fails the check is marked `binding_lost_at` (once). Answers each
 * allocation's outcome. Idempotent: judging the same reports again changes nothing.
 */
export async function judgeReservationReports(
  trx: Trx,
  reservationId: string,
): Promise<Record<string, ReportJudgement['outcome']>> {
  const allocations = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .where((eb) =>
      eb.exists(eb.selectFrom('allocation_reports as r').whereRef('r.allocation_id', '=', 'allocations.id')),
    )
    .select('id')
    .orderBy('id')
    .execute();
  const outcomes: Record<string, ReportJudgement['outcome']> = {};
  for (const { id } of allocations) {
    const judged = await judgeAllocationReport(trx, id);
    outcomes[id] = judged.outcome;
    if (judged.outcome === 'binding-lost') {
      await trx
        .updateTable('allocations')
        .set({ binding_lost_at: sql<Date>`COALESCE(binding_lost_at, compute_now())` })
        .where('id', '=', id)
        .execute();
    }
  }
  return outcomes;
}
