import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ComputeClient } from '../../client/index.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { defaultTimers } from '../../domain/reservation-lifecycle.ts';
import { eventually } from '../support/eventually.ts';
import { checkBilling, historyMismatches, liveWithoutWorkflow } from '../support/fault-checks.ts';
import { type AnswerNote, AnswerTally, countingClient, type Load, startLoad } from '../support/fault-load.ts';
import { useFixture } from '../support/hooks.ts';
import { type ClusterStack, startClusterStack } from './cluster-stack.ts';

/**
 * The production shape under load and faults: a Temporal cluster (four services, four history
 * shards) on PostgreSQL, two API processes behind HAProxy, two workers, two gateways, simulated
 * nodes spread over both gateways, and clients creating, extending and releasing reservations
 * through the load balancer all along. One API process, one worker, one gateway and the Temporal
 * history service are killed one at a time, then together, then PostgreSQL; the cluster's
 * supervisor restarts each. Afterwards: no overlapping booking, no live reservation without its
 * workflow, no window billed twice, every node connected, and every answer a success or a typed
 * retryable error. BC_CLUSTER_TEST_NODES sets the fleet (default 200).
 */
const nodes = Number(process.env.BC_CLUSTER_TEST_NODES ?? 200);
const stack: ClusterStack = useFixture(
  () => startClusterStack({ nodes }),
  (s) => s.stop(),
);
const tally = new AnswerTally();
let load: Load;
let probe: ComputeClient;
let probes = 0;

beforeAll(() => {
  const options = { baseURL: stack.cluster.apiUrl, token: stack.acme.token, tally };
  load = startLoad({ ...options, tenantId: 'acme', poolId: stack.poolId, clients: 4 });
  probe = countingClient(options);
});

afterAll(async () => {
  await load?.stop();
});

/** One more reservation goes all the way to `active` and is released: every part works again. */
async function recovered(): Promise<void> {
  const created = await probe.reservations.create({
    tenantId: 'acme',
    poolId: stack.poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '10m',
    idempotencyKey: `probe-${++probes}`,
  });
  await eventually(async () => {
    // A read is safe to repeat: the client retries it after a dropped connection too.
    const now = await probe.reservations.get(
      { tenantId: 'acme', reservationId: created.id },
      { idempotent: true },
    );
    return now.state === 'active';
  }, 90_000);
  await probe.reservations.release({ tenantId: 'acme', reservationId: created.id }, { idempotent: true });
}

/**
 * A refusal the load can meet when nothing is wrong: an extend of a reservation that its node's
 * loss (an unreachable node, repaired) put back to `pending`, which only placed, binding or active
 * reservations allow (README: reservations.extend).
 */
function legitimateRefusal(note: AnswerNote): boolean {
  return note.method === 'reservations.extend' && note.code === 'INVALID_STATE' && note.state === 'pending';
}

async function moreCreated(n: number): Promise<void> {
  const target = load.created() + n;
  await eventually(async () => load.created() >= target, 90_000);
}

async function allNodesConnected(): Promise<void> {
  await eventually(async () => stack.connected().connected === nodes, 90_000);
}

/** SIGKILLs the members named, then waits until the supervisor brought every one back. */
async function crash(...names: string[]): Promise<void> {
  const members = names.map((name) => stack.cluster.member(name));
  const pids = members.map((m) => m.pid());
  await Promise.all(members.map((m) => m.crash()));
  await Promise.all(members.map((m, i) => m.restartedFrom(pids[i]!, 150_000)));
}

describe('the production-shaped cluster under load and faults', () => {
  it('starts with the nodes spread over both gateways and the load answered through the load balancer', async () => {
    await allNodesConnected();
    const { byGateway } = stack.connected();
    expect(Object.keys(byGateway).sort()).toEqual([...stack.cluster.gatewayAddresses].sort());
    await moreCreated(4);
  }, 120_000);

  it('an API process is killed: the other answers, the supervisor restarts it', async () => {
    tally.phase = 'api-1 killed';
    await crash('api-1');
    await moreCreated(4);
    await recovered();
  }, 200_000);

  it('a worker is killed: the other carries the lifecycles, the supervisor restarts it', async () => {
    tally.phase = 'worker-1 killed';
    await crash('worker-1');
    await recovered();
  }, 200_000);

  it('a gateway is killed: its nodes reconnect to the other one', async () => {
    tally.phase = 'gateway-1 killed';
    const gone = stack.cluster.member('gateway-1').address!;
    await crash('gateway-1');
    await allNodesConnected();
    await recovered();
    expect(stack.connected().byGateway[gone] ?? 0).toBeLessThan(nodes);
  }, 200_000);

  it('the Temporal history service is killed: workflows carry on once it is back', async () => {
    tally.phase = 'temporal-history killed';
    await crash('temporal-history');
    await recovered();
  }, 200_000);

  it('all four together', async () => {
    tally.phase = 'together';
    await crash('api-2', 'worker-2', 'gateway-2', 'temporal-history');
    await allNodesConnected();
    await recovered();
  }, 240_000);

  it('PostgreSQL is restarted: answers are typed meanwhile, everything reconnects', async () => {
    tally.phase = 'postgresql restarted';
    await crash('postgresql');
    tally.phase = 'postgresql back';
    await recovered();
    await allNodesConnected();
  }, 240_000);

  it('afterwards nothing is lost', async () => {
    tally.phase = 'drain';
    await load.stop();
    await eventually(
      async () => (await liveWithoutWorkflow(stack.db, stack.temporalClient)).length === 0,
      120_000,
    );
    for (const h of load.histories) {
      if (!h.id) {
        const created = await probe.reservations.create({
          tenantId: 'acme',
          poolId: stack.poolId,
          devices: [{ class: 'gpu', count: 1 + (Number(h.key.split('-')[2]) % 2) }],
          duration: '10m',
          idempotencyKey: h.key,
        });
        h.id = created.id;
        h.createdEnd = created.during?.end ?? null;
      }
      if (!h.released || 'failed' in h.released) {
        const released = await probe.reservations.release(
          { tenantId: 'acme', reservationId: h.id },
          { idempotent: true },
        );
        h.released = { state: released.state };
      }
    }
    let mismatches: string[] = [];
    await eventually(async () => {
      mismatches = await historyMismatches(stack.db, stack.temporalClient, load.histories);
      return mismatches.length === 0;
    }, 120_000).catch(() => {});
    expect(mismatches).toEqual([]);
    expect(await checkBookingInvariants(stack.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
    const billing = await checkBilling(stack.db, defaultTimers.usageWindowMs);
    expect(billing).toMatchObject({ overlappingWindows: 0, overbilledAllocations: 0, ledgerMismatches: 0 });
    expect(await liveWithoutWorkflow(stack.db, stack.temporalClient)).toEqual([]);
    await allNodesConnected();
    console.log(
      'cluster faults:',
      JSON.stringify(
        {
          nodes,
          reservations: load.histories.length,
          probes,
          usageWindows: billing.windows,
          connected: stack.connected(),
          answersByPhase: tally.toJSON(),
          notes: tally.notes,
        },
        null,
        2,
      ),
    );
    expect(tally.untyped()).toEqual([]);
    // HAProxy closes the client's keep-alive connection without an answer when the API process
    // behind it dies mid-request (the client is to retry, as after a keep-alive race): every call
    // here is idempotent, so the client retries it (`CONNECTION retried`). A request whose last
    // answer was a dropped connection was not answered.
    const unanswered = Object.entries(tally.toJSON()).filter(
      ([, codes]) => (codes.CONNECTION ?? 0) > (codes['CONNECTION retried'] ?? 0),
    );
    expect(unanswered).toEqual([]);
    // The refusals the load may meet, each for its documented reason; anything else is a bug.
    expect(tally.notes.filter((note) => note.code !== 'CONNECTION' && !legitimateRefusal(note))).toEqual([]);
  }, 300_000);
});
