/**
 * What each part of a guarded booking costs PostgreSQL over a bare insert, measured by pgbench
 * (PostgreSQL's own load generator, from the same binaries as the server: no Node client sharing
 * the cores) at 8 connections without contention. Issue 14 asks for a guarded booking at most
 * 1.3 times an unguarded insert; this shows which parts that figure is made of.
 *
 * Six tables, each adding one part, loaded in `--rounds` alternating rounds of `--seconds` each
 * (the machine's drift weighs on all alike), every insert one autocommit statement, prepared:
 *
 *   bare          device_bookings' columns and CHECK, nothing else
 *   primary       + PRIMARY KEY (allocation_id, device_id)
 *   allocationFk  + the foreign key to allocations
 *   keyed         + the foreign key to devices: every key of device_bookings, no guard
 *   constraint    the EXCLUDE constraint of device_bookings alone: no keys, no lock
 *   guarded       device_bookings itself with its per-device lock, as insertDeviceBookings writes one
 *
 * Every insert books a random device of the fleet for a random hour of a year, for a fresh
 * allocation (prepareBookingLoad's). Its device id is read by number from a side table in the same
 * statement, the same small cost in every variant. Reported as transactions/s and as a cost factor
 * over `bare`. The last line is one JSON object.
 * Usage: node --import tsx bench/guard-parts.ts [--nodes 10000] [--seconds 8] [--rounds 3]
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { sql } from 'kysely';
import { deviceLockSpace } from '../db/allocations/bookings.ts';
import { findPostgresBinDir } from '../db/local-postgres.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import { benchDatabase, insertBenchPool, prepareBookingLoad } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '10000' },
    seconds: { type: 'string', default: '8' },
    rounds: { type: 'string', default: '3' },
  },
});
const nodeCount = Number(values.nodes);
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);
const connections = 8;
const allocationCount = 2_000_000;

const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
const run = promisify(execFile);

const bench = await benchDatabase('guard_parts', { max: 4 });
const scripts = mkdtempSync(path.join(tmpdir(), 'guard-parts-'));
try {
  const pgbench = path.join(findPostgresBinDir(), 'pgbench');
  const { siteId, poolId } = await insertBenchPool(bench.db);
  const nodes = await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  const deviceIds = nodes.flatMap((n) => n.deviceIds);
  // Its allocations (`alloc_1` …) and the bare and keyed copies of device_bookings.
  await prepareBookingLoad(bench.db, { poolId, nodeId: nodes[0]!.id, deviceIds, count: allocationCount });
  const { rows } = await sql<{ constraint: string }>`
    SELECT pg_get_constraintdef(oid) AS constraint FROM pg_constraint
    WHERE conname = 'device_bookings_no_overlap'`.execute(bench.db);
  const exclusion = rows[0]!.constraint;
  await sql`
    ALTER TABLE device_bookings_unguarded ADD CHECK (NOT isempty(during));
    CREATE TABLE guard_part_devices (n int PRIMARY KEY, id text NOT NULL);
    INSERT INTO guard_part_devices SELECT row_number() OVER (ORDER BY id), id FROM devices;
    CREATE TABLE guard_part_primary (LIKE device_bookings_unguarded INCLUDING ALL, PRIMARY KEY (allocation_id, device_id));
    CREATE TABLE guard_part_allocation_fk (
      LIKE device_bookings_unguarded INCLUDING ALL,
      PRIMARY KEY (allocation_id, device_id),
      FOREIGN KEY (allocation_id) REFERENCES allocations (id) ON DELETE CASCADE);
    CREATE TABLE guard_part_constraint (LIKE device_bookings_unguarded INCLUDING ALL, ${sql.raw(exclusion)});
  `.execute(bench.db);
  await sql`VACUUM ANALYZE`.execute(bench.db);
  console.log(`[${load()}] ${deviceIds.length} devices on ${nodeCount} nodes; the constraint: ${exclusion}`);

  const row = `SELECT d.id, 'alloc_' || :a,
         tstzrange(timestamptz '2030-01-01' + :h * interval '1 hour', timestamptz '2030-01-01' + (:h + 1) * interval '1 hour', '[)')
       FROM guard_part_devices AS d WHERE d.n = :d`;
  // A rare repeat of a random allocation and device, or an overlap, is skipped alike everywhere.
  const insertInto = (table: string, where = '') =>
    `INSERT INTO ${table} (device_id, allocation_id, during) ${row}${where} ON CONFLICT DO NOTHING;`;
  const parts: Record<string, string> = {
    bare: insertInto('device_bookings_unguarded'),
    primary: insertInto('guard_part_primary'),
    allocationFk: insertInto('guard_part_allocation_fk'),
    keyed: insertInto('device_bookings_keyed'),
    constraint: insertInto('guard_part_constraint'),
    guarded: insertInto(
      'device_bookings',
      ` AND pg_advisory_xact_lock(${deviceLockSpace}, hashtext(d.id)) IS NOT NULL`,
    ),
  };
  const header = `\\set d random(1, ${deviceIds.length})\n\\set h random(0, 8759)\n\\set a random(1, ${allocationCount})\n`;
  for (const [name, statement] of Object.entries(parts)) {
    writeFileSync(path.join(scripts, `${name}.sql`), `${header}${statement}\n`);
  }
  const tps = async (name: string, forSeconds: number) => {
    const { stdout } = await run(
      pgbench,
      ['-n', '-M', 'prepared', '-c', String(connections), '-j', '2', '-T', String(forSeconds)].concat([
        '-f',
        path.join(scripts, `${name}.sql`),
        bench.url,
      ]),
      { maxBuffer: 1 << 20 },
    );
    const found = /tps = ([\d.]+)/.exec(stdout);
    if (!found) throw new Error(`pgbench printed no rate for ${name}: ${stdout.slice(-400)}`);
    return Number(found[1]);
  };
  // One short run of each first, not counted (the first load after the loading runs slower).
  for (const name of Object.keys(parts)) await tps(name, 1);
  const sums: Record<string, number> = {};
  for (let round = 1; round <= rounds; round++) {
    const line: string[] = [];
    for (const name of Object.keys(parts)) {
      const rate = await tps(name, seconds);
      sums[name] = (sums[name] ?? 0) + rate;
      line.push(`${name} ${Math.round(rate)}/s`);
    }
    console.log(`[${load()}] round ${round}: ${line.join(', ')}`);
  }
  const perSecond = Object.fromEntries(Object.keys(parts).map((n) => [n, Math.round(sums[n]! / rounds)]));
  const factorOverBare = Object.fromEntries(
    Object.keys(parts).map((n) => [n, Number((perSecond.bare! / perSecond[n]!).toFixed(3))]),
  );
  for (const name of Object.keys(parts)) {
    console.log(
      `${name.padEnd(13)} ${String(perSecond[name]).padStart(6)}/s  ${factorOverBare[name]} × bare`,
    );
  }
  console.log(JSON.stringify({ nodes: nodeCount, seconds, rounds, connections, perSecond, factorOverBare }));
} finally {
  rmSync(scripts, { recursive: true, force: true });
  await bench.dispose();
}
