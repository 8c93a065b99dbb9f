import { Client } from '@temporalio/client';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import type { IamDb } from '../../core/iam-database.ts';
import { insertConfirmation } from '../../db/iam/confirmations.ts';
import { newId } from '../../domain/ids.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { cancelSignal, confirmSignal, releaseSignal } from '../../workflows/reservation/operator-signals.ts';
import { tenantMember } from '../support/iam.ts';
import {
  eventTypes,
  insertPlacedReservation,
  insertUnplacedReservation,
  quotaRefunded,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

// A long bind deadline: a binding reservation stays binding while the refusals are checked.
const h = useLifecycleHarness({ name: 'operator-signals', nodes: 4, timers: { bindTimeoutMs: 120_000 } });

const operator = 'ops-alice@console';

/** A Temporal client that sends as the operator, as `temporal workflow signal --identity` would. */
function operatorClient(): Client {
  return new Client({ connection: h.temporal.client.connection, identity: operator });
}

async function auditRows(id: string) {
  return h.db
    .selectFrom('audit_events')
    .select(['actor_identity_id', 'action', 'outcome', 'context'])
    .where('resource_id', '=', id)
    .orderBy('id')
    .execute();
}

async function refusals(id: string) {
  const rows = await h.db
    .selectFrom('outbox_events')
    .select('data')
    .where('subject', '=', `reservation/${id}`)
    .where('type', '=', 'reservation.signal-refused')
    .orderBy('seq')
    .execute();
  return rows.map((r) => r.data as Record<string, unknown>);
}

describe('operator signals on a reservation lifecycle', () => {
  it('cancel withdraws a placed reservation, its audit row naming the Temporal identity', async () => {
    const placed = await insertPlacedReservation(h, { node: h.nodes[0]!, startInMs: 3_600_000 });
    await h.startLifecycle(placed.id, 'placed');
    await operatorClient().workflow.getHandle(placed.id).signal(cancelSignal, { reason: 'customer asked' });
    expect(await waitForState(h, placed.id, 'cancelled')).toMatchObject({ end_reason: 'cancel' });
    expect(await quotaRefunded(h, placed.id)).toBe(true);
    expect(await eventTypes(h, placed.id)).toContain('reservation.cancelled');
    const audit = (await auditRows(placed.id)).filter((r) => r.action === 'compute:reservations:release');
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({
      actor_identity_id: `temporal:${operator}`,
      outcome: 'allowed',
      context: {
        via: 'temporal-signal',
        signal: 'cancel',
        temporalIdentity: operator,
        reason: 'customer asked',
      },
    });
  });

  it('release ends an active reservation and frees its bookings', async () => {
    const active = await insertPlacedReservation(h, { node: h.nodes[1]! });
    await h.startLifecycle(active.id, 'placed');
    await waitForState(h, active.id, 'binding');
    await reportAllocation(h, active.id, active.allocationId, 'bound');
    await waitForState(h, active.id, 'active');
    await operatorClient().workflow.getHandle(active.id).signal(releaseSignal);
    expect(await waitForState(h, active.id, 'released')).toMatchObject({ end_reason: 'release' });
    expect(await quotaRefunded(h, active.id)).toBe(true);
    const audit = await auditRows(active.id);
    expect(audit.filter((r) => r.actor_identity_id === `temporal:${operator}`)).toHaveLength(1);
  });

  it('refuses a cancel after the start and bad input, publishing each refusal with its reason', async () => {
    const binding = await insertPlacedReservation(h, { node: h.nodes[2]! });
    await h.startLifecycle(binding.id, 'placed');
    await waitForState(h, binding.id, 'binding');
    const handle = operatorClient().workflow.getHandle(binding.id);
    await handle.signal(cancelSignal);
    await handle.signal(releaseSignal, { reason: 42 } as unknown as { reason: string });
    await handle.signal(confirmSignal, { decision: 'approved' });
    await expect.poll(() => refusals(binding.id), { timeout: 20_000 }).toHaveLength(3);
    const refused = await refusals(binding.id);
    const bySignal = Object.fromEntries(refused.map((r) => [r.signal, r]));
    expect(bySignal).toMatchObject({
      cancel: { code: 'INVALID_STATE', state: 'binding', temporalIdentity: operator },
      release: { code: 'INVALID_INPUT', temporalIdentity: operator },
      confirm: { code: 'INVALID_STATE', temporalIdentity: operator },
    });
    expect(String(bySignal.cancel!.reason)).toMatch(/not started/);
    const denied = (await auditRows(binding.id)).filter((r) => r.outcome === 'denied');
    expect(denied.map((r) => r.actor_identity_id)).toEqual(Array(3).fill(`temporal:${operator}`));
    // Nothing changed: it still binds, and a valid release still applies afterwards.
    expect((await waitForState(h, binding.id, 'binding')).state).toBe('binding');
    await handle.signal(releaseSignal, { reason: 'done' });
    expect(await waitForState(h, binding.id, 'released')).toMatchObject({ end_reason: 'release' });
  });

  it('confirm denies the IAM confirmation a reservation awaits, and the lifecycle denies it', async () => {
    const iamDb = h.db as unknown as IamDb;
    await bootstrapPlatform(h.iam);
    const person = await tenantMember(h.iam, h.tenantId, { name: 'pat' });
    const agent = await h.iam.admin.createIdentity({ tenantId: h.tenantId, kind: 'agent', name: 'bot' });
    const delegationId = `dlg_${newId('cnf').slice(4)}`;
    await sql`INSERT INTO iam.delegations (id, agent_identity_id, person_identity_id, confirm_actions)
      VALUES (${delegationId}, ${agent.id}, ${person.identityId}, ARRAY['compute:reservations:create'])`.execute(
      h.db,
    );
    const pending = await insertUnplacedReservation(h, { state: 'awaiting-confirmation' });
    const confirmationId = newId('cnf');
    await insertConfirmation(iamDb, {
      id: confirmationId,
      tenantId: h.tenantId,
      delegationId,
      agentIdentityId: agent.id,
      personIdentityId: person.identityId,
      action: 'compute:reservations:create',
      resource: { type: 'compute-reservation', id: pending },
      requestHash: null,
      ttlMs: 600_000,
    });
    await h.db
      .updateTable('reservations')
      .set({ confirmation_id: confirmationId })
      .where('id', '=', pending)
      .execute();
    await h.startLifecycle(pending, 'awaiting-confirmation');
    await operatorClient().workflow.getHandle(pending).signal(confirmSignal, { decision: 'denied' });
    expect(await waitForState(h, pending, 'denied')).toMatchObject({ end_reason: 'confirmation-denied' });
    const stored = await iamDb
      .selectFrom('iam.confirmations')
      .select('state')
      .where('id', '=', confirmationId)
      .executeTakeFirstOrThrow();
    expect(stored.state).toBe('denied');
    const audit = (await auditRows(pending)).find((r) => r.action === 'compute:confirmations:decide');
    expect(audit).toMatchObject({
      actor_identity_id: `temporal:${operator}`,
      context: { decision: 'denied', confirmationId, temporalIdentity: operator },
    });
  });

  it('a pending reservation cancelled by signal is cancelled once, whatever the retries', async () => {
    const pending = await insertUnplacedReservation(h, { state: 'pending', gpus: 16 });
    await h.startLifecycle(pending, 'pending');
    const handle = operatorClient().workflow.getHandle(pending);
    await handle.signal(cancelSignal);
    expect(await waitForState(h, pending, 'cancelled')).toMatchObject({ end_reason: 'cancel' });
    expect((await eventTypes(h, pending)).filter((t) => t === 'reservation.cancelled')).toHaveLength(1);
    await expect(handle.result()).resolves.toMatchObject({ state: 'cancelled' });
  });
});
