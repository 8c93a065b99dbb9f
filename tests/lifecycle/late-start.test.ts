import { describe, expect, it } from 'vitest';
import { insertPlacedReservation, useLifecycleHarness, waitForState } from './harness.ts';

const h = useLifecycleHarness({ name: 'late_start', nodes: 1 });

/** The reasons of the reservation's `reservation.binding-rejected` events. */
async function rejections(reservationId: string): Promise<string[]> {
  const rows = await h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${reservationId}`)
    .where('type', '=', 'reservation.binding-rejected')
    .select('data')
    .execute();
  return rows.map((r) => (r.data as { reason: string }).reason);
}

describe('a lifecycle started after its reservation began binding', () => {
  it('judges the reports stored while no workflow ran before it waits, with no signal about them', async () => {
    const node = h.nodes[0]!;
    const { id, allocationId } = await insertPlacedReservation(h, { node });
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');
    const handle = h.temporal.client.workflow.getHandle(id);
    await handle.terminate('the test stops the lifecycle while the node reports');
    // The gateway stores a report as received; this one carries no signature, so judging rejects it.
    await h.db
      .insertInto('allocation_reports')
      .values({
        allocation_id: allocationId,
        node_id: node.id,
        kind: 'bound',
        epoch: 1,
        report: Buffer.from('{}'),
        sig_kid: null,
        sig: null,
      })
      .execute();
    expect(await rejections(id)).toEqual([]);

    // As the orphan sweeper would: a new run, woken by nothing but its start.
    await h.startLifecycle(id, 'binding');
    await expect.poll(() => rejections(id), { timeout: 20_000 }).toEqual(['unsigned report']);
    expect((await waitForState(h, id, 'binding')).state).toBe('binding');

    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });
});
