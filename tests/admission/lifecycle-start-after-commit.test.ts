import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { afterCommitWaitMs } from '../../api/reservations/access.ts';
import { RecordingLifecycle } from '../support/recording-lifecycle.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

/** A lifecycle seam whose starts are recorded at once and answer only once the test lets them. */
class HeldStarts extends RecordingLifecycle {
  release: () => void = () => {};
  readonly #held = new Promise<void>((resolve) => {
    this.release = resolve;
  });
  answered = 0;

  override async start(reservation: { id: string; state: string }): Promise<void> {
    await super.start(reservation);
    await this.#held;
    this.answered++;
  }
}

const lifecycle = new HeldStarts();
const h = useAdmissionHarness({ lifecycle });
let acme: TenantFixture;
let poolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  ({ poolId } = await h100Pool(h, { nodes: 4, tenants: ['acme'], gpuQuota: 64 }));
});
afterAll(() => lifecycle.release());

describe("a create's lifecycle start after its commit", () => {
  it('does not hold the answer: creates answer while Temporal has answered none of their starts', async () => {
    const count = 10;
    const ids: string[] = [];
    // wall time: how long the creates took, the property under test (each waited up to
    // afterCommitWaitMs on its start before; ten of them in a row took at least ten times that)
    const began = Date.now();
    for (let i = 0; i < count; i++) {
      const res = await h.call(acme.token, 'reservations/create', {
        tenantId: 'acme',
        poolId,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '1h',
        idempotencyKey: `held-start-${i}`,
      });
      expect(res.status).toBe(200);
      expect(res.body.data.state).toBe('placed');
      ids.push(res.body.data.id);
    }
    const took = Date.now() - began;
    expect(took).toBeLessThan((count * afterCommitWaitMs) / 2);
    // Every start was asked for at its commit, and none has answered yet.
    expect(lifecycle.started.map((s) => s.id)).toEqual(ids);
    expect(lifecycle.answered).toBe(0);

    lifecycle.release();
    await expect.poll(() => lifecycle.answered).toBe(count);
  });
});
