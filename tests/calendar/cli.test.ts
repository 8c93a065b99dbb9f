import { beforeAll, describe, expect, test, vi } from 'vitest';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { readComputeNow } from '../../db/clock.ts';
import { repairReservationBookings } from '../../db/reservations/repair.ts';
import { json, runCli } from '../cli/run-cli.ts';
import { useTestApi } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let env: Record<string, string>;
let poolId: string;
beforeAll(async () => {
  env = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  const pool = await seedPool(api.database.db, {
    site: 'site-calendar-cli',
    ownerTenantId: api.root.tenantId,
    nodes: 2,
    namePrefix: 'cal',
    offers: { acme: { gpu: 16 } },
  });
  poolId = pool.poolId;
});

describe('reserve --start and the repairs of reservations get', () => {
  test('books a later start given as +2h or an ISO date-time, and shows a repair readably and in JSON', async () => {
    const db = api.database.db;
    const now = (await readComputeNow(db)).getTime();
    const relative = await runCli(
      [
        'reserve',
        '--tenant',
        'acme',
        '--pool',
        poolId,
        '--gpus',
        '8',
        '--for',
        '1h',
        '--start',
        '+2h',
        '--json',
      ],
      env,
    );
    expect(relative.code, relative.stderr).toBe(0);
    const r = json(relative) as { id: string; state: string; during: { start: number } };
    expect(r.state).toBe('placed');
    expect(Math.abs(r.during.start - (now + 2 * 3_600_000))).toBeLessThan(120_000);

    const at = `${new Date(now + 4 * 3_600_000).toISOString().slice(0, 16)}Z`;
    const absolute = await runCli(
      [
        'reserve',
        '--tenant',
        'acme',
        '--pool',
        poolId,
        '--gpus',
        '1',
        '--for',
        '30m',
        '--start',
        at,
        '--json',
      ],
      env,
    );
    expect(absolute.code, absolute.stderr).toBe(0);
    expect((json(absolute) as { during: { start: number } }).during.start).toBe(Date.parse(at));

    // Its node is cordoned and BookingRepair (its transaction, as the workflow runs it) moves it.
    const allocation = await db
      .selectFrom('allocations')
      .where('reservation_id', '=', r.id)
      .select('node_id')
      .executeTakeFirstOrThrow();
    await db.updateTable('nodes').set({ cordoned: true }).where('id', '=', allocation.node_id).execute();
    const outcome = await withPlacementTransaction(db, (trx) =>
      repairReservationBookings(trx, { reservationId: r.id, moment: 'pre-start' }),
    );
    expect(outcome.outcome, JSON.stringify(outcome)).toBe('repaired');

    const shown = await runCli(['reservations', 'get', r.id, '--tenant', 'acme'], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).toMatch(
      /booking repairs:\n.*pre-start: repaired\n\s+cal-\d+ → cal-\d+ \(cordoned; 8 atom\(s\)/,
    );
    const asJson = await runCli(['reservations', 'get', r.id, '--tenant', 'acme', '--json'], env);
    const view = json(asJson) as {
      repairs: Array<{ outcome: string; moves: Array<{ fromNodeId: string }> }>;
    };
    expect(view.repairs).toEqual([
      expect.objectContaining({
        outcome: 'repaired',
        moves: [expect.objectContaining({ fromNodeId: allocation.node_id })],
      }),
    ]);
  });
});
