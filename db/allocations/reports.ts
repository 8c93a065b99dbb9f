import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { type AttestationVerdict, verifyAttestedReport } from '../../domain/attestation.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { findAttestationCertificates } from '../nodes/nodes.ts';

type Trx = Transaction<Database>;

export interface ReportJudgement {
  allocationId: string;
  reservationId: string | null;
  nodeId: string;
  /** The kind of the latest stored report, or null when the node never reported. */
  kind: 'bound' | 'failed' | 'released' | null;
  verdict: AttestationVerdict | null;
  /** What the judgement did to the allocation. */
  outcome: 'bound' | 'failed' | 'released' | 'rejected' | 'binding-lost' | 'unchanged' | 'no-report';
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
    .select(['a.id', 'a.node_id', 'a.reservation_id', 'a.state', 'a.bound_at', 'r.tenant_id', 'r.pool_id'])
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
  const live = ['planned', 'binding', 'bound'].includes(allocation.state);
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
