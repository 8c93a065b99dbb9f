import { beforeAll, describe, expect, test, vi } from 'vitest';
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
    site: 'site-spot-cli',
    ownerTenantId: api.root.tenantId,
    nodes: 1,
    namePrefix: 'spot',
    offers: { acme: { gpu: 16 } },
  });
  poolId = pool.poolId;
});

const reserve = (...extra: string[]) =>
  runCli(
    ['reserve', '--tenant', 'acme', '--pool', poolId, '--gpus', '8', '--for', '2h', ...extra, '--json'],
    env,
  );

describe('reserve --spot and the preemption deadline in reservations get', () => {
  test('a spot reservation shows when it is released for the regular one that preempted it', async () => {
    const spot = json(await reserve('--spot'));
    expect(spot).toMatchObject({ state: 'placed', request: { spot: true } });
    // The node reported it bound (this test has no lifecycle): it has started.
    const db = api.database.db;
    await db.updateTable('reservations').set({ state: 'active' }).where('id', '=', spot.id).execute();
    await db
      .updateTable('allocations')
      .set({ state: 'bound' })
      .where('reservation_id', '=', spot.id)
      .execute();

    const regular = json(await reserve());
    expect(regular.state).toBe('placed');
    const deadline: number = regular.during.start;

    const [text, asJson, help] = await Promise.all([
      runCli(['reservations', 'get', spot.id, '--tenant', 'acme'], env),
      runCli(['reservations', 'get', spot.id, '--tenant', 'acme', '--json'], env),
      runCli(['reserve', '--help'], env),
    ]);
    expect(text.code).toBe(0);
    const at = new Date(deadline).toISOString().replace(/\.\d{3}Z$/, 'Z');
    expect(text.stdout).toMatch(new RegExp(`preempted:\\s+released at ${at} for ${regular.id}`));
    expect(text.stdout).toContain('Preempted (SpotPreempted)');
    expect(json(asJson).conditions).toContainEqual(
      expect.objectContaining({ type: 'Preempted', deadline, preemptedBy: regular.id }),
    );
    expect(help.stdout).toContain('spot meter');
  });
});
