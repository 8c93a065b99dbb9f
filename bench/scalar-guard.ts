/**
 * What the scalar guard of scalar_bookings costs an insert statement, under the statement trigger
 * (migration 2026-12-07T01) and under the two row triggers it replaced (its `down()`), in one
 * database: `--nodes` ready nodes with `--bookings` scalar bookings already on them (one vcpu and
 * one memoryGiB booking each, random nodes, random windows of 2030), one client, no contention.
 *
 * Each statement books `--rows` rows in one insert, as the pool-lease batch does (24: 12
 * allocations of vcpu and memoryGiB on 12 random nodes) or as the inline placer does (2: one
 * allocation), for 4 hours from a random hour of 2030's last two days: a node's bookings still to
 * end are then the few around that hour, as they are around now in a running pool. With
 * `--anywhere` the hour is any of the year's, and each of the guard's lookups reads every booking
 * of the node still to end (half of them on average). Every statement is rolled back, so the table
 * stays as it was. The two guards alternate in `--rounds` slices of `--statements` statements (the
 * machine's drift weighs on both), each slice after a VACUUM of the rolled-back rows. Reported per
 * statement: the client's time (BEGIN, INSERT, ROLLBACK) and the guard functions' own time from
 * pg_stat_user_functions. `--generic-plans` has the session plan every query of the guards once,
 * whatever its parameters (a row trigger's are its row's). The last line is one JSON object.
 * Usage: node --import tsx bench/scalar-guard.ts [--nodes 2000] [--bookings 50000] [--rows 24,2]
 *        [--statements 500] [--rounds 3] [--anywhere] [--generic-plans]
 */
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import pg from 'pg';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import * as statementGuard from '../migrations/2026-12-07T01-scalar-guard-per-statement.ts';
import { benchDatabase, insertBenchPool } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '2000' },
    bookings: { type: 'string', default: '50000' },
    rows: { type: 'string', default: '24,2' },
    statements: { type: 'string', default: '500' },
    rounds: { type: 'string', default: '3' },
    anywhere: { type: 'boolean', default: false },
    'generic-plans': { type: 'boolean', default: false },
  },
});
const nodeCount = Number(values.nodes);
const bookingCount = Number(values.bookings);
const rowCounts = values.rows.split(',').map(Number);
const statements = Number(values.statements);
const rounds = Number(values.rounds);
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');

const bench = await benchDatabase('scalar_guard', { max: 2 });
const client = new pg.Client({ connectionString: bench.url });
try {
  const { siteId, poolId } = await insertBenchPool(bench.db);
  const nodes = await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  const nodeIds = nodes.map((n) => n.id);
  const fresh = Math.max(...rowCounts) / 2;
  // The background bookings' allocations and `fresh` more for the statements (all stored as
  // superseded: a reservation has one current allocation per node).
  await sql`
    INSERT INTO reservations (id, tenant_id, pool_id, owner_identity_id, idempotency_key, request, request_hash,
                              state, duration_ms)
    VALUES ('rsv_bench', 'tnt_bench', ${poolId}, 'idn_bench', 'bench', '{}', 'bench', 'placed', 3600000)`.execute(
    bench.db,
  );
  await sql`
    INSERT INTO allocations (id, reservation_id, node_id, state, during, superseded_at)
    SELECT 'alloc_' || g, 'rsv_bench', ${nodeIds[0]}, 'planned', tstzrange(compute_now(), compute_now() + interval '1 hour'),
           compute_now()
    FROM generate_series(1, ${bookingCount + fresh}) AS g`.execute(bench.db);
  await sql`
    INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
    SELECT 'alloc_' || g, (${nodeIds}::text[])[1 + (g * 7919) % ${nodeCount}], r, 1,
           tstzrange(timestamptz '2030-01-01' + (g * 104729 % 8760) * interval '1 hour',
                     timestamptz '2030-01-01' + (g * 104729 % 8760 + 1 + g % 12) * interval '1 hour')
    FROM generate_series(1::bigint, ${bookingCount}) AS g, unnest(ARRAY['vcpu', 'memoryGiB']) AS r`.execute(
    bench.db,
  );
  await sql`VACUUM ANALYZE`.execute(bench.db);
  await client.connect();
  await client.query(`SET track_functions = 'pl'`);
  if (values['generic-plans']) await client.query('SET plan_cache_mode = force_generic_plan');
  console.log(`[${load()}] ${nodeCount} nodes, ${bookingCount * 2} scalar bookings`);

  const insert = `INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
    SELECT a, n, r, 1, tstzrange(s, s + interval '4 hours', '[)')
    FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(a, n, r, i), (SELECT $4::timestamptz AS s) AS w
    ORDER BY i`;
  /** One statement's parameters: `rows` / 2 fresh allocations of vcpu and memoryGiB on random nodes. */
  const parameters = (rows: number) => {
    const picked = Array.from({ length: rows / 2 }, (_, k) => ({
      allocation: `alloc_${bookingCount + 1 + k}`,
      node: nodeIds[Math.floor(Math.random() * nodeCount)]!,
    }));
    const ordered = picked
      .flatMap((p) => ['memoryGiB', 'vcpu'].map((resource) => ({ ...p, resource })))
      .sort((a, b) => (a.node + a.resource).localeCompare(b.node + b.resource));
    const hours = values.anywhere ? Math.random() * 8760 : 8712 + Math.random() * 48;
    const start = new Date(Date.UTC(2030, 0, 1) + Math.floor(hours) * 3_600_000);
    return [
      ordered.map((o) => o.allocation),
      ordered.map((o) => o.node),
      ordered.map((o) => o.resource),
      start.toISOString(),
    ];
  };
  /** The guard functions' total time so far (ms), flushed from this session first. */
  const guardMs = async () => {
    await client.query('SELECT pg_stat_force_next_flush()');
    await client.query('SELECT pg_stat_clear_snapshot()');
    const { rows } = await client.query<{ ms: number | null }>(
      `SELECT sum(total_time)::float8 AS ms FROM pg_stat_user_functions 
       WHERE funcname IN ('guard_scalar_booking', 'guard_scalar_booking_with_holds', 'guard_scalar_bookings_inserted')`,
    );
    return rows[0]?.ms ?? 0;
  };
  const guards = {
    rowTriggers: () => statementGuard.down(bench.db),
    statementTrigger: () => statementGuard.up(bench.db),
  };
  type Guard = keyof typeof guards;
  const sums: Record<string, { clientMs: number; guardMs: number; statements: number }> = {};
  let current: Guard = 'statementTrigger';
  for (let round = 1; round <= rounds; round++) {
    const line: string[] = [];
    for (const guard of Object.keys(guards) as Guard[]) {
      if (guard !== current) await guards[guard]();
      current = guard;
      for (const rows of rowCounts) {
        await sql`VACUUM scalar_bookings`.execute(bench.db);
        for (let i = 0; i < 20; i++) {
          await client.query('BEGIN');
          await client.query({ name: `insert${rows}`, text: insert, values: parameters(rows) });
          await client.query('ROLLBACK');
        }
        const guardBefore = await guardMs();
        // wall time: the client's time per statement
        const started = performance.now();
        for (let i = 0; i < statements; i++) {
          await client.query('BEGIN');
          await client.query({ name: `insert${rows}`, text: insert, values: parameters(rows) });
          await client.query('ROLLBACK');
        }
        const clientMs = performance.now() - started;
        const guardSpent = (await guardMs()) - guardBefore;
        const key = `${guard} ${rows}`;
        const sum = sums[key] ?? { clientMs: 0, guardMs: 0, statements: 0 };
        sums[key] = sum;
        sum.clientMs += clientMs;
        sum.guardMs += guardSpent;
        sum.statements += statements;
        line.push(
          `${key}: ${(clientMs / statements).toFixed(3)} ms, guard ${(guardSpent / statements).toFixed(3)} ms`,
        );
      }
    }
    console.log(`[${load()}] round ${round}: ${line.join('; ')}`);
  }
  const perStatement = Object.fromEntries(
    Object.entries(sums).map(([key, s]) => [
      key,
      {
        clientMs: Number((s.clientMs / s.statements).toFixed(3)),
        guardMs: Number((s.guardMs / s.statements).toFixed(3)),
      },
    ]),
  );
  for (const rows of rowCounts) {
    const before = perStatement[`rowTriggers ${rows}`]!;
    const after = perStatement[`statementTrigger ${rows}`]!;
    console.log(
      `${rows} rows a statement: guard ${before.guardMs} ms → ${after.guardMs} ms (${(after.guardMs / before.guardMs).toFixed(2)}×), ` +
        `statement ${before.clientMs} ms → ${after.clientMs} ms (${(after.clientMs / before.clientMs).toFixed(2)}×)`,
    );
  }
  console.log(
    JSON.stringify({
      nodes: nodeCount,
      bookings: bookingCount * 2,
      statements,
      rounds,
      anywhere: values.anywhere,
      genericPlans: values['generic-plans'],
      perStatement,
      loadAverage: load(),
    }),
  );
} finally {
  await client.end();
  await bench.dispose();
}
