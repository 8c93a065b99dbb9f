/**
 * The control plane's CPU per Join, without the herd around it: `joinNode` (JoinService's body,
 * as the gateway runs it) called N times with `--concurrency` in flight against a private
 * PostgreSQL, every machine with its own key, CSR and hardware evidence made beforehand (the
 * machines' side is not counted). Reports this process's CPU (CSR check, certificate, kysely and
 * pg) plus PostgreSQL's (`/proc` of the postmaster and its backends) per Join, the statements per
 * Join (counted at the pg driver, BEGIN and COMMIT included), and wall time. The last line is one JSON object.
 * Usage: node --import tsx bench/join-cpu.ts [--joins 400] [--concurrency 8]
 */

import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { createLogger } from '../core/logger.ts';
import { SimHardware } from '../daemon/hardware.ts';
import { loadSigningCertificateAuthority } from '../db/nodes/certificate-authority.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { createCsr, generateKeyPairPem } from '../domain/pki.ts';
import { createSealer } from '../domain/sealing.ts';
import { joinNode } from '../gateway/join-service.ts';
import { benchDatabase, insertBenchPool, postgresCpuSeconds, postmasterPidOf } from './support.ts';

const { values } = parseArgs({
  options: {
    joins: { type: 'string', default: '400' },
    concurrency: { type: 'string', default: '8' },
  },
});
const joins = Number(values.joins);
const concurrency = Number(values.concurrency);
// Every statement sent (BEGIN and COMMIT included), counted at the driver.
let queries = 0;
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
(pg.Client.prototype as unknown as { query: unknown }).query = function (
  this: pg.Client,
  ...args: unknown[]
) {
  queries++;
  return query.apply(this, args);
};
const load = () => loadavg().map((l) => Number(l.toFixed(2)));
const loadBefore = load();

const bench = await benchDatabase('join_cpu', { max: concurrency + 2 });
const postmaster = await postmasterPidOf(bench.pool);
try {
  const trustDomain = 'better-compute.local';
  const ca = await loadSigningCertificateAuthority(bench.db, {
    trustDomain,
    sealer: createSealer(randomBytes(32).toString('hex')),
  });
  const { poolId } = await insertBenchPool(bench.db);
  const { token } = await createJoinToken(bench.db, { poolId, ttlSeconds: 3600, maxUses: joins + 20 });
  const options = {
    db: bench.db,
    log: createLogger({ level: 'warn', name: 'bench-join-cpu' }),
    ca,
    trustDomain,
    certificateTtlMs: 24 * 3600_000,
  };
  const request = async (i: number) => ({
    token,
    csrPem: await createCsr(await generateKeyPairPem(), `j${i}`),
    evidence: new SimHardware(`join-cpu-${i}`).evidence(),
    requestedName: `j${i}`,
    agentVersion: 'bench',
    reclaimProof: undefined,
  });
  // Warm up (the first joins compile the code paths), not counted.
  for (let i = 0; i < 20; i++) await joinNode(options, await request(joins + i));
  const requests: Array<Awaited<ReturnType<typeof request>>> = [];
  for (let i = 0; i < joins; i++) requests.push(await request(i));
  queries = 0;
  const cpu0 = process.cpuUsage();
  const pg0 = postgresCpuSeconds(postmaster);
  const started = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < joins) await joinNode(options, requests[next++]!);
    }),
  );
  const wallSeconds = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const nodeCpu = (cpu.user + cpu.system) / 1e6;
  const pgCpu = postgresCpuSeconds(postmaster) - pg0;
  const result = {
    joins,
    concurrency,
    joinsPerSecond: Math.round(joins / wallSeconds),
    cpuMsPerJoin: Number((((nodeCpu + pgCpu) * 1000) / joins).toFixed(2)),
    nodeCpuMsPerJoin: Number(((nodeCpu * 1000) / joins).toFixed(2)),
    postgresCpuMsPerJoin: Number(((pgCpu * 1000) / joins).toFixed(2)),
    queriesPerJoin: Number((queries / joins).toFixed(2)),
    loadBefore,
    loadAfter: load(),
  };
  console.error(
    `${joins} joins, ${concurrency} in flight: ${result.joinsPerSecond}/s, CPU per Join ${result.cpuMsPerJoin} ms ` +
      `(Node ${result.nodeCpuMsPerJoin} + PostgreSQL ${result.postgresCpuMsPerJoin}), ${result.queriesPerJoin} queries per Join ` +
      `(BEGIN and COMMIT included); load ${loadBefore} → ${result.loadAfter}`,
  );
  console.log(JSON.stringify(result));
} finally {
  await bench.dispose();
}
process.exit(0);
