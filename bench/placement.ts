/**
 * Placements per second through HTTP: 10,000 simulated nodes (80,000 GPUs) registered in the
 * database, the API served on a real port, and 50 concurrent clients each creating reservations
 * (`reservations.create`, 4 GPUs in one NVLink domain, a fresh idempotency key per call) from ten
 * tenants. Every create goes the whole admission path: authentication (cached), the tenant
 * pre-check, the draft transaction, one IAM decision, the placement transaction with quota, outbox
 * and audit. No lifecycle workflows are started (admission never waits on Temporal).
 * Usage: node --import tsx bench/placement.ts [--seconds 20] [--nodes 10000] [--clients 50]
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { checkBookingInvariants } from '../db/allocations/invariants.ts';
import { insertPool, insertSite, offerPool, registerReadyNodes } from '../db/nodes/fleet.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { listen } from '../server/http.ts';
import { benchDatabase, runLoad } from './support.ts';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '20' },
    nodes: { type: 'string', default: '10000' },
    clients: { type: 'string', default: '50' },
    gpus: { type: 'string', default: '4' },
    connections: { type: 'string', default: '20' },
  },
});
const seconds = Number(values.seconds);
const nodeCount = Number(values.nodes);
const clients = Number(values.clients);
const gpus = Number(values.gpus);

const bench = await benchDatabase('placement', { max: Number(values.connections) });

/** CPU seconds (user + system) used so far by this process and by the PostgreSQL server's processes. */
function cpuSeconds(postmasterPid: number | null) {
  const tick = 100;
  const read = (pid: number | string) => {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      return { ppid: Number(fields[1]), cpu: (Number(fields[11]) + Number(fields[12])) / tick };
    } catch {
      return null;
    }
  };
  const self = read('self')?.cpu ?? 0;
  let postgres = 0;
  if (postmasterPid) {
    for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
      const stat = read(pid);
      if (stat && (Number(pid) === postmasterPid || stat.ppid === postmasterPid)) postgres += stat.cpu;
    }
  }
  return { node: self, postgres };
}
const log = createLogger({ level: 'warn', name: 'bench' });
try {
  const t0 = performance.now();
  const iam = createEmbeddedIam({ db: bench.db, log });
  const { rootAdminToken } = await bootstrapPlatform(iam);
  const siteId = await insertSite(bench.db, { name: 'bench', region: 'eu-central-1' });
  const poolId = await insertPool(bench.db, {
    siteId,
    ownerTenantId: 'platform',
    name: 'h100',
    gpuModel: 'h100',
  });
  await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  const tokens: Array<{ tenantId: string; token: string }> = [];
  for (let i = 0; i < 10; i++) {
    const tenantId = `tenant-${i}`;
    await iam.admin.createTenant({ id: tenantId, name: tenantId });
    const identity = await iam.admin.createIdentity({ tenantId, kind: 'service', name: 'loader' });
    await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
    tokens.push({ tenantId, token: (await iam.admin.createToken({ identityId: identity.id })).token });
    await offerPool(bench.db, { poolId, tenantId, quota: { gpu: nodeCount * 8 } });
  }
  await bench.pool.query('VACUUM ANALYZE');
  console.log(
    `loaded ${nodeCount} nodes (${nodeCount * 8} GPUs) and 10 tenants in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );

  // Rate limits off: 50 clients on 10 tokens measure admission, not the per-token limit.
  const config = parseConfig({
    BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
    BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
  });
  const compute = createCompute({ config, db: bench.db, log, iam });
  const server = await listen(compute.app, '127.0.0.1', 0);
  const post = async (token: string, body: unknown) => {
    const response = await fetch(`${server.url}/api/compute/reservations/create`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'x-better-compute': '1',
      },
      body: JSON.stringify(body),
    });
    const json = (await response.json()) as {
      data?: { state: string };
      error?: { code: string; message: string };
    };
    if (json.error) throw Object.assign(new Error(json.error.message), { code: json.error.code });
    return json.data!;
  };
  // Warm-up: authentication caches and the per-GPU share.
  for (const t of tokens) {
    await post(t.token, {
      tenantId: t.tenantId,
      poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: `warm-${t.tenantId}`,
    });
  }
  const { rows: dirRows } = await bench.pool.query('SHOW data_directory');
  let postmasterPid: number | null = null;
  try {
    postmasterPid = Number(
      readFileSync(path.join(dirRows[0].data_directory, 'postmaster.pid'), 'utf8').split('\n')[0],
    );
  } catch {
    postmasterPid = null;
  }
  const cpuBefore = cpuSeconds(postmasterPid);
  const result = await runLoad(clients, seconds, async (worker, i) => {
    const t = tokens[worker % tokens.length]!;
    const r = await post(t.token, {
      tenantId: t.tenantId,
      poolId,
      devices: [{ class: 'gpu', count: gpus, topology: 'nvlink-all' }],
      duration: '8h',
      idempotencyKey: `bench-${i}`,
    });
    return r.state === 'placed';
  });
  const cpuAfter = cpuSeconds(postmasterPid);
  await server.stop();
  const cpu = {
    nodeSeconds: Number((cpuAfter.node - cpuBefore.node).toFixed(1)),
    postgresSeconds: Number((cpuAfter.postgres - cpuBefore.postgres).toFixed(1)),
  };
  const perCpuSecond = Math.round(result.committed / Math.max(0.1, cpu.nodeSeconds + cpu.postgresSeconds));
  const invariants = await checkBookingInvariants(bench.db);
  console.log(
    JSON.stringify({
      nodes: nodeCount,
      gpus: nodeCount * 8,
      clients,
      gpusPerReservation: gpus,
      placements: result.committed,
      pending: result.refused,
      errors: result.errors,
      seconds: result.seconds,
      placementsPerSecond: result.perSecond,
      placementsPerCpuSecond: perCpuSecond,
      cpu,
      p50Ms: result.p50Ms,
      p99Ms: result.p99Ms,
      invariants,
      rootAdminToken: rootAdminToken ? 'minted' : 'none',
    }),
  );
} finally {
  await bench.dispose();
}
