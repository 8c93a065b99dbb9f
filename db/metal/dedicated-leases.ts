import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { machineWorkflowKey } from '../../domain/dedicated-root.ts';
import { isComputeError } from '../../domain/errors.ts';
import { planClean, planDeploy } from '../../domain/metal-steps.ts';
import { truncateAllocationBookings } from '../allocations/bookings.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { setNodeMaintenance } from '../nodes/provision.ts';
import { parseStoredRequest } from '../reservations/stored.ts';
import { findProfile } from './profiles.ts';
import { insertMetalWorkflow, requestMetalAbort } from './workflows.ts';

type Trx = Transaction<Database>;

/**
 * The lifecycle of a dedicated-root lease (`binding: 'node'`) on its machines, in the reservation
 * lifecycle's transactions: the deploy of the lease's profile at the start, the allocation bound
 * once the machine is deployed and joined, and on the end the wipe (a `clean` workflow) before the
 * bookings are freed. The provisioning workflows themselves are db/metal/workflow-advance.ts.
 */

/** The reason a lease's deploy could not start or failed, as a reservation condition. */
function deployFailedCondition(message: string) {
  return { type: 'Unschedulable', reason: 'DeployFailed', message: message.slice(0, 1_000) };
}

async function addCondition(
  trx: Trx,
  reservationId: string,
  condition: ReturnType<typeof deployFailedCondition>,
) {
  await sql`
    UPDATE reservations SET conditions = (
      SELECT COALESCE(jsonb_agg(c), '[]'::jsonb) FROM jsonb_array_elements(conditions) c
      WHERE c->>'reason' IS DISTINCT FROM ${condition.reason}) || ${JSON.stringify([condition])}::jsonb,
      updated_at = compute_now()
    WHERE id = ${reservationId}`.execute(trx);
}

async function failAllocation(trx: Trx, allocationId: string): Promise<void> {
  await trx
    .updateTable('allocations')
    .set({ state: 'failed', updated_at: sql<Date>`compute_now()` })
    .where('id', '=', allocationId)
    .where('state', 'in', ['planned', 'binding'])
    .execute();
}

/**
 * The start of a lease's binding, in the caller's transaction (the lifecycle's `beginBinding`):
 * for each current allocation one `deploy` provisioning workflow of the lease's pinned profile on
 * its machine (idempotent by the allocation: `lease-deploy:<allocationId>`), moving the machine to
 * `deploying`. A machine that cannot start it (no longer `ready`, another workflow running) has
 * its allocation failed and the reason in a `DeployFailed` condition: the lease then fails, it is
 * never placed a second time. Answers the nodes of the allocations.
 */
export async function startMachineDeploys(
  trx: Trx,
  reservation: { id: string; tenant_id: string; request: unknown },
): Promise<string[]> {
  const request = parseStoredRequest(reservation.id, reservation.request);
  const allocations = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', reservation.id)
    .where('superseded_at', 'is', null)
    .where('state', '=', 'binding')
    .select(['id', 'node_id'])
    .orderBy('id')
    .execute();
  const wanted = request.node!;
  const profile = await findProfile(trx, { profileId: wanted.profileId, version: wanted.profileVersion });
  for (const allocation of allocations) {
    await sql`SAVEPOINT machine_deploy`.execute(trx);
    try {
      if (!profile) throw new Error(`profile ${wanted.profileId} version ${wanted.profileVersion} is gone`);
      const { workflowId } = await insertMetalWorkflow(trx, {
        kind: 'deploy',
        nodeId: allocation.node_id,
        tenantId: reservation.tenant_id,
        profileId: profile.id,
        profileVersion: profile.version,
        idempotencyKey: machineWorkflowKey('deploy', allocation.id),
        allocationId: allocation.id,
        steps: planDeploy({
          ...(profile.spec.stepTimeoutSeconds ? { timeoutSeconds: profile.spec.stepTimeoutSeconds } : {}),
          maxAttempts: profile.spec.maxAttempts,
        }),
        verb: `the dedicated-root lease ${reservation.id}`,
      });
      await trx
        .updateTable('allocations')
        .set({
          binding: JSON.stringify({
            kind: 'node',
            workflowId,
            profileId: profile.id,
            profileVersion: profile.version,
          }),
        })
        .where('id', '=', allocation.id)
        .execute();
      await sql`RELEASE SAVEPOINT machine_deploy`.execute(trx);
    } catch (error) {
      if (isComputeError(error) && error.code === 'INTERNAL') throw error;
      await sql`ROLLBACK TO SAVEPOINT machine_deploy`.execute(trx);
      const why = error instanceof Error ? error.message : String(error);
      await failAllocation(trx, allocation.id);
      await addCondition(
        trx,
        reservation.id,
        deployFailedCondition(`the deploy on node ${allocation.node_id} could not start: ${why}`),
      );
    }
  }
  return allocations.map((a) => a.node_id);
}

/**
 * A binding lease looks at its deploys, in the caller's transaction: an allocation whose deploy
 * succeeded and whose machine is `deployed` with the deployed system joined (role `node`,
 * connected) is bound (`bound_at` now); one whose deploy failed or was aborted is failed, with the
 * workflow's reason in a `DeployFailed` condition (the machine is already in maintenance with it).
 * Idempotent. Answers how many allocations it changed.
 */
export async function syncMachineDeploys(trx: Trx, reservationId: string): Promise<number> {
  const rows = await trx
    .selectFrom('allocations as a')
    .innerJoin('metal_workflows as w', (join) =>
      join.onRef('w.allocation_id', '=', 'a.id').on('w.kind', '=', 'deploy'),
    )
    .innerJoin('nodes as n', 'n.id', 'a.node_id')
    .where('a.reservation_id', '=', reservationId)
    .where('a.superseded_at', 'is', null)
    .where('a.state', '=', 'binding')
    .select([
      'a.id',
      'a.node_id',
      'w.id as workflow_id',
      'w.state',
      'w.reason',
      'n.provision_state',
      'n.role',
      'n.connectivity',
    ])
    .orderBy('a.id')
    .forUpdate('a')
    .execute();
  let changed = 0;
  for (const row of rows) {
    const joined =
      row.provision_state === 'deployed' && row.role === 'node' && row.connectivity === 'connected';
    if (row.state === 'succeeded' && joined) {
      await trx
        .updateTable('allocations')
        .set({ state: 'bound', bound_at: sql<Date>`compute_now()`, updated_at: sql<Date>`compute_now()` })
        .where('id', '=', row.id)
        .execute();
      changed++;
    } else if (row.state === 'failed' || row.state === 'aborted') {
      await failAllocation(trx, row.id);
      await addCondition(
        trx,
        reservationId,
        deployFailedCondition(
          `the deploy ${row.workflow_id} on node ${row.node_id} ${row.state}: ${row.reason ?? 'no reason recorded'}; the machine is in maintenance with the reason`,
        ),
      );
      changed++;
    }
  }
  return changed;
}

/**
 * The end of a lease, in the caller's transaction (the lifecycle's `endReservation`, before the
 * other allocations are ended): each current allocation whose deploy succeeded keeps its bookings,
 * leaves the current placement as `releasing`, and its machine starts a `clean` workflow (boot the
 * ramdisk, wipe the disk, power off: `deployed` → `cleaning` → `ready`), idempotent by the
 * allocation; the bookings are freed when that workflow is over (`freeCleanedMachine`). A deploy
 * still running is aborted (its cleanup powers the machine off; it ends in maintenance) and a
 * failed one is left to the operator in maintenance: their bookings are freed with the others.
 */
export async function holdMachinesForCleaning(trx: Trx, reservation: { id: string; tenant_id: string }) {
  const rows = await trx
    .selectFrom('allocations as a')
    .innerJoin('metal_workflows as w', (join) =>
      join.onRef('w.allocation_id', '=', 'a.id').on('w.kind', '=', 'deploy'),
    )
    .where('a.reservation_id', '=', reservation.id)
    .where('a.superseded_at', 'is', null)
    .select(['a.id', 'a.node_id', 'w.id as workflow_id', 'w.state'])
    .orderBy('a.id')
    .forUpdate('a')
    .execute();
  for (const row of rows) {
    if (row.state === 'running') {
      await requestMetalAbort(trx, row.workflow_id, `the dedicated-root lease ${reservation.id} ended`);
      continue;
    }
    if (row.state !== 'succeeded') continue;
    await sql`SAVEPOINT machine_clean`.execute(trx);
    try {
      await insertMetalWorkflow(trx, {
        kind: 'clean',
        nodeId: row.node_id,
        tenantId: reservation.tenant_id,
        profileId: null,
        profileVersion: null,
        idempotencyKey: machineWorkflowKey('clean', row.id),
        allocationId: row.id,
        steps: planClean({ maxAttempts: 3 }),
        verb: `the end of the dedicated-root lease ${reservation.id}`,
      });
      await sql`RELEASE SAVEPOINT machine_clean`.execute(trx);
    } catch (error) {
      if (!isComputeError(error) || error.code === 'INTERNAL') throw error;
      // The wipe cannot start (the machine was moved on by hand): out of placement until an
      // operator wipes it; its bookings are freed with the others.
      await sql`ROLLBACK TO SAVEPOINT machine_clean`.execute(trx);
      await setNodeMaintenance(trx, {
        nodeId: row.node_id,
        reason:
          `the dedicated-root lease ${reservation.id} ended but its wipe could not start: ${error.message}`.slice(
            0,
            500,
          ),
        tenantId: reservation.tenant_id,
      });
      continue;
    }
    await trx
      .updateTable('allocations')
      .set({
        state: 'releasing',
        superseded_at: sql<Date>`compute_now()`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', row.id)
      .execute();
  }
}

/**
 * A lease's machine is wiped (its `clean` workflow over, succeeded or aborted), in that workflow's
 * transaction: the allocation's bookings end now (future ones deleted) and it is `released`, with
 * a `reservation.machine-freed` event. Idempotent: an allocation already released changes nothing.
 */
export async function freeCleanedMachine(
  trx: Trx,
  input: { allocationId: string; workflowId: string; outcome: 'succeeded' | 'aborted' },
): Promise<void> {
  const allocation = await trx
    .selectFrom('allocations as a')
    .innerJoin('reservations as r', 'r.id', 'a.reservation_id')
    .where('a.id', '=', input.allocationId)
    .where('a.state', '=', 'releasing')
    .select(['a.id', 'a.node_id', 'r.id as reservation_id', 'r.tenant_id'])
    .forUpdate('a')
    .executeTakeFirst();
  if (!allocation) return;
  await truncateAllocationBookings(trx, allocation.id);
  await trx
    .updateTable('allocations')
    .set({
      state: 'released',
      released_at: sql<Date>`COALESCE(released_at, compute_now())`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', allocation.id)
    .execute();
  await insertOutboxEvent(trx, {
    type: 'reservation.machine-freed',
    subject: `reservation/${allocation.reservation_id}`,
    tenantId: allocation.tenant_id,
    data: {
      reservationId: allocation.reservation_id,
      allocationId: allocation.id,
      nodeId: allocation.node_id,
      cleanWorkflowId: input.workflowId,
      cleaned: input.outcome === 'succeeded',
    },
  });
}

/**
 * The provisioning workflows of a lease's allocations that are still running (deploys and
 * cleans): the ones its lifecycle makes sure run on Temporal. Read-only.
 */
export async function runningMachineWorkflowIds(db: Db | Trx, reservationId: string): Promise<string[]> {
  const rows = await db
    .selectFrom('metal_workflows as w')
    .innerJoin('allocations as a', 'a.id', 'w.allocation_id')
    .where('a.reservation_id', '=', reservationId)
    .where('w.state', '=', 'running')
    .select('w.id')
    .orderBy('w.id')
    .execute();
  return rows.map((r) => r.id);
}

/** The reservation whose lease a provisioning workflow serves (through its allocation), or null. */
export async function leaseOfWorkflow(db: Db | Trx, workflowId: string): Promise<string | null> {
  const row = await db
    .selectFrom('metal_workflows as w')
    .innerJoin('allocations as a', 'a.id', 'w.allocation_id')
    .where('w.id', '=', workflowId)
    .select('a.reservation_id')
    .executeTakeFirst();
  return row?.reservation_id ?? null;
}
