import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { confirmationUpdate, snapshotQuery } from '../../workflows/reservation/messages.ts';
import { searchAttributes } from '../../workflows/search-attributes.ts';
import { eventTypes, insertUnplacedReservation, useLifecycleHarness, waitForState } from './harness.ts';

const h = useLifecycleHarness({ name: 'confirmation', nodes: 1 });

const start = (id: string) => h.startLifecycle(id, 'awaiting-confirmation');

describe('delegated confirmation', () => {
  it('expires a reservation whose confirmation deadline passes', async () => {
    const id = await insertUnplacedReservation(h, {
      state: 'awaiting-confirmation',
      confirmationExpiresInMs: 1_500,
    });
    await start(id);
    const expired = await waitForState(h, id, 'expired', 30_000);
    expect(expired.end_reason).toBe('confirmation-expired');
    expect(await eventTypes(h, id)).toEqual(['reservation.expired']);
  });

  it('after approval, the retried admission places it and the lifecycle takes it on to binding', async () => {
    const id = await insertUnplacedReservation(h, {
      state: 'awaiting-confirmation',
      confirmationExpiresInMs: 60_000,
    });
    await start(id);
    const handle = h.temporal.client.workflow.getHandle(id);
    await expect.poll(() => handle.query(snapshotQuery), { timeout: 20_000 }).not.toBeNull();
    await expect(
      handle.executeUpdate(confirmationUpdate, { args: [{ decision: 'maybe' as 'approved' }] }),
    ).rejects.toThrow();
    await h.lifecycle.signal(id, { type: 'confirmation', decision: 'approved' });
    expect((await waitForState(h, id, 'awaiting-confirmation')).state).toBe('awaiting-confirmation');

    // What admission's retry with the same key commits: the draft is placed on the node.
    const node = h.nodes[0]!;
    await h.db.transaction().execute(async (trx) => {
      await sql`UPDATE reservations SET state = 'placed', conditions = '[]', confirmation_id = NULL,
        during = tstzrange(compute_now(), compute_now() + interval '1 hour', '[)'), version = version + 1
        WHERE id = ${id}`.execute(trx);
      await sql`INSERT INTO allocations (id, reservation_id, node_id, state, during)
        VALUES (${`alloc_${id.slice(4, 20)}`}, ${id}, ${node.id}, 'planned', tstzrange(compute_now(), compute_now() + interval '1 hour', '[)'))`.execute(
        trx,
      );
    });
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');
    await expect(
      h.lifecycle.signal(id, { type: 'confirmation', decision: 'approved' }),
    ).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });

  it('denies a reservation whose confirmation is refused', async () => {
    const id = await insertUnplacedReservation(h, {
      state: 'awaiting-confirmation',
      confirmationExpiresInMs: 60_000,
    });
    await start(id);
    await h.lifecycle.signal(id, { type: 'confirmation', decision: 'denied' });
    expect((await waitForState(h, id, 'denied')).end_reason).toBe('confirmation-denied');
  });

  it('starts the lifecycle of a reservation nobody started when a decision arrives for it', async () => {
    const id = await insertUnplacedReservation(h, {
      state: 'awaiting-confirmation',
      confirmationExpiresInMs: 60_000,
    });
    await h.lifecycle.signal(id, { type: 'confirmation', decision: 'denied' });
    expect((await waitForState(h, id, 'denied')).end_reason).toBe('confirmation-denied');
    const described = await h.temporal.client.workflow.getHandle(id).describe();
    expect(described.typedSearchAttributes.get(searchAttributes.tenant)).toBe('acme');
  });
});
