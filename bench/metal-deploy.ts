/**
 * 100 bare machines deployed at once through one site agent, everything real in one process: a
 * private PostgreSQL, the Temporal dev server with a worker hosting the provisioning workflows, the
 * API, the gateway with mutual TLS, the Redfish emulator of sushy-tools (`--fake`, one BMC serving
 * every system, power changes applied 1 to 11 s later), one site agent holding the site's boot
 * lease, and simulated machines that follow the emulator's power and boot device (their ramdisks
 * and deployed systems join as real agents). The machines are enrolled and inspected first; then
 * every machine gets `metal.deploy` at once, and 10% of them (chosen at random) fail at a random
 * step: the BMC refuses the credentials (power-off), the ramdisk never joins (power-on-ramdisk,
 * its rejoin wait times out), or the image's digest does not match (write-image). It reports the
 * time until every machine is `deployed` or in `maintenance` with a reason, and how many are left
 * in between (0 expected). Progress lines while it runs; the last line is one JSON object.
 * Usage: node --import tsx bench/metal-deploy.ts [--machines 100] [--fail-percent 10]
 *        [--step-timeout-seconds 90] [--seed 1]
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { BootNetwork } from '../daemon/boot-network.ts';
import { MetalMachines } from '../daemon/metal-machines.ts';
import { signImage } from '../domain/metal-images.ts';
import { generateReleaseSigningKey } from '../domain/release-manifest.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { connectTemporal } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { startWorker } from '../temporal/worker.ts';
import { callApi } from '../tests/support/api.ts';
import { emulatedSystems, startMetalSite } from '../tests/support/metal-site.ts';
import { smallH100Shape } from '../tests/support/sim-shapes.ts';
import { benchDatabase, benchTemporal } from './support.ts';

const { values } = parseArgs({
  options: {
    machines: { type: 'string', default: '100' },
    'fail-percent': { type: 'string', default: '10' },
    'step-timeout-seconds': { type: 'string', default: '90' },
    seed: { type: 'string', default: '1' },
  },
});
const count = Number(values.machines);
const failing = Math.round((count * Number(values['fail-percent'])) / 100);
const stepTimeoutSeconds = Number(values['step-timeout-seconds']);
// A small seeded generator, so a run's choice of machines and steps can be repeated.
let seed = Number(values.seed) >>> 0 || 1;
const random = () => {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 2 ** 32;
};
const log = createLogger({ level: 'warn', name: 'bench' });
const progress = (line: string) =>
  process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);

const signer = generateReleaseSigningKey();
const imageBytes = Buffer.from('a bootable raw disk image, simulated\n'.repeat(4096));
const imageSha = createHash('sha256').update(imageBytes).digest('hex');
const imageServer = createServer((request, response) => {
  if (request.url === '/images/ubuntu.raw') response.writeHead(200).end(imageBytes);
  else response.writeHead(404).end();
});
await new Promise<void>((resolve) => imageServer.listen(0, '127.0.0.1', resolve));
const imageUrl = `http://127.0.0.1:${(imageServer.address() as { port: number }).port}/images/ubuntu.raw`;

const bench = await benchDatabase('metal', { max: 40 });
const { address, stop: stopTemporal } = await benchTemporal(log);
const taskQueue = `bench-metal-${randomBytes(4).toString('hex')}`;
const config = parseConfig({
  BETTER_COMPUTE_SECRET: randomBytes(32).toString('hex'),
  BETTER_COMPUTE_IMAGE_SIGNER_PINS: signer.pin,
  BETTER_COMPUTE_TASK_QUEUE: taskQueue,
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
});
const temporal = await connectTemporal({ address });
const worker = await startWorker({
  db: bench.db,
  log,
  iam: { recordUsage: async () => {} } as never,
  address,
  taskQueue,
  sweeper: false,
});
const iam = createEmbeddedIam({ db: bench.db, log });
const platform = await bootstrapPlatform(iam);
const compute = createCompute({ config, db: bench.db, log, iam, temporal: temporal.client });
// biome-ignore lint/suspicious/noExplicitAny: the answers are read field by field
const call = async (method: string, body: unknown): Promise<any> => {
  const answer = await callApi(compute.app, platform.rootAdminToken, method, body);
  if (answer.status !== 200) throw new Error(`${method}: ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body.data;
};

const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-metal-'));
const network = new BootNetwork();
const systems = emulatedSystems(count, 'bench');
const machines = new MetalMachines({
  dir: path.join(dir, 'machines'),
  log,
  network,
  systems,
  shape: smallH100Shape,
});
const notifyUrl = await machines.listen();
const load = () =>
  loadavg()
    .map((l) => l.toFixed(1))
    .join(' / ');
const loadBefore = load();
/** The site agents' `bmc.*` commands completed since `since`, by outcome, and their rate. */
const bmcCommandsSince = async (since: Date, seconds: number) => {
  const rows = await bench.db
    .selectFrom('node_commands')
    .where('kind', 'like', 'bmc.%')
    .where('completed_at', '>=', since)
    .select(['state'])
    .execute();
  const byState = Object.fromEntries(
    [...new Set(rows.map((r) => r.state))].map((s) => [s, rows.filter((r) => r.state === s).length]),
  );
  return { count: rows.length, byState, perSecond: Math.round((rows.length / seconds) * 100) / 100 };
};
const t0 = Date.now();
const seconds = (from: number) => Math.round((Date.now() - from) / 100) / 10;
let site: Awaited<ReturnType<typeof startMetalSite>> | undefined;
try {
  progress(`starting the site: ${count} emulated systems, one site agent (load ${loadBefore})`);
  site = await startMetalSite({
    db: bench.db,
    config,
    call,
    dir,
    log,
    machines: count,
    name: 'bench',
    notifyUrl,
    bootNetwork: network,
    inspect: true,
    lifecycle: createTemporalLifecycle(temporal.client, { taskQueue }),
    gatewayOptions: { leaseMs: 30_000, heartbeatIntervalMs: 5_000, deliveryIntervalMs: 100 },
    onEmulator: async (_emulator, gateway) =>
      machines.attach({ address: gateway.address, caCertificatePem: gateway.caCertificatePem }),
  });
  const enrolled = site.machines;
  let inspected: Array<{ id: string; ready: boolean }> = [];
  for (;;) {
    const rows = await bench.db
      .selectFrom('nodes')
      .where('id', 'in', enrolled)
      .select(['id', 'provision_state', 'maintenance'])
      .execute();
    inspected = rows.map((r) => ({ id: r.id, ready: r.provision_state === 'ready' && !r.maintenance }));
    const ready = inspected.filter((r) => r.ready).length;
    const stuck = rows.filter((r) => r.maintenance).length;
    progress(`inspection: ${ready} of ${count} ready, ${stuck} in maintenance (${seconds(t0)} s)`);
    if (ready + stuck >= count) break;
    await new Promise((r) => setTimeout(r, 5_000));
  }
  const inspectedSeconds = seconds(t0);
  // A machine inspection left in maintenance (with its reason) is not deployed.
  const ids = enrolled.filter((id) => inspected.find((r) => r.id === id)?.ready);
  const inspection = {
    seconds: inspectedSeconds,
    ready: ids.length,
    maintenance: count - ids.length,
    bmcCommands: await bmcCommandsSince(new Date(t0), inspectedSeconds),
    loadAfter: load(),
  };
  progress(`inspection done: ${JSON.stringify(inspection)}`);

  const identity = { name: 'ubuntu', version: '24.04', format: 'raw' as const, sha256: imageSha };
  const image = await call('images/register', {
    ...identity,
    url: imageUrl,
    signature: signImage(identity, signer.privateKeyPem),
  });
  const wrong = await call('images/register', {
    name: 'ubuntu',
    version: '24.04-wrong-digest',
    format: 'raw',
    sha256: 'c'.repeat(64),
    url: imageUrl,
  });
  const limits = { stepTimeoutSeconds, maxAttempts: 1 };
  const good = await call('profiles/create', {
    name: 'bench',
    spec: { imageId: image.id, acceptance: ['inventory-reported', 'gpus-present'], ...limits },
  });
  const bad = await call('profiles/create', {
    name: 'bench-bad-digest',
    spec: { imageId: wrong.id, ...limits },
  });

  // 10% of the machines fail, each at one step drawn at random.
  const faults = ['bmc-credentials', 'silent-ramdisk', 'digest-mismatch'] as const;
  const order = ids.map((id, i) => ({ id, i, r: random() })).sort((a, b) => a.r - b.r);
  const planned = new Map<string, (typeof faults)[number]>();
  for (const { id } of order.slice(0, failing))
    planned.set(id, faults[Math.floor(random() * faults.length)]!);
  for (const [id, fault] of planned) {
    const system = systems[enrolled.indexOf(id)]!;
    if (fault === 'silent-ramdisk') machines.silentRamdisks.add(system.uuid);
    if (fault === 'bmc-credentials') {
      // The BMC's account is not the one enrolled (a credential rotated at the BMC): it answers 401.
      await bench.db
        .updateTable('bmc_endpoints')
        .set({ username: 'rotated-away' })
        .where('node_id', '=', id)
        .execute();
    }
  }

  progress(
    `deploying ${ids.length} machines at once (${failing} set to fail: ${[...planned.values()].join(', ')})`,
  );
  const t1 = Date.now();
  const workflows = await Promise.all(
    ids.map((nodeId) =>
      call('metal/deploy', {
        nodeId,
        profileId: planned.get(nodeId) === 'digest-mismatch' ? bad.id : good.id,
        idempotencyKey: `bench-${nodeId}`,
      }),
    ),
  );
  const admittedSeconds = seconds(t1);
  let final: { deployed: number; maintenance: number; between: number; withoutReason: number };
  for (;;) {
    const rows = await bench.db
      .selectFrom('nodes')
      .where('id', 'in', ids)
      .select(['provision_state', 'maintenance', 'maintenance_reason'])
      .execute();
    const deployed = rows.filter((r) => r.provision_state === 'deployed' && !r.maintenance).length;
    const maintenance = rows.filter((r) => r.maintenance && r.maintenance_reason).length;
    const withoutReason = rows.filter((r) => r.maintenance && !r.maintenance_reason).length;
    const running = await bench.db
      .selectFrom('metal_workflows')
      .where(
        'id',
        'in',
        workflows.map((w) => w.id as string),
      )
      .where('state', '=', 'running')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .executeTakeFirstOrThrow();
    final = { deployed, maintenance, between: ids.length - deployed - maintenance, withoutReason };
    progress(
      `deploy: ${deployed} deployed, ${maintenance} in maintenance, ${final.between} in between, ${running.n} workflows running (${seconds(t1)} s, load ${load()})`,
    );
    if (Number(running.n) === 0 && final.between === 0) break;
    if (Number(running.n) === 0 && seconds(t1) > 60) break;
    await new Promise((r) => setTimeout(r, 5_000));
  }
  const deploySeconds = seconds(t1);
  const deployBmcCommands = await bmcCommandsSince(new Date(t1), deploySeconds);
  const reasons = await bench.db
    .selectFrom('nodes')
    .where('id', 'in', ids)
    .where('maintenance', '=', true)
    .select(['id', 'maintenance_reason'])
    .execute();
  const failedAt = reasons.map(
    (r) => /failed at step ([a-z-]+)/.exec(r.maintenance_reason ?? '')?.[1] ?? 'other',
  );
  const byStep = Object.fromEntries(
    [...new Set(failedAt)].map((s) => [s, failedAt.filter((x) => x === s).length]),
  );
  const unexpected = reasons.filter((r) => !planned.has(r.id)).length;
  console.log(
    JSON.stringify({
      machines: count,
      planned: failing,
      inspectSeconds: inspectedSeconds,
      inspection,
      deployBmcCommands,
      admitSeconds: admittedSeconds,
      deploySeconds,
      deployedMachines: ids.length,
      perMachineSeconds: Math.round((deploySeconds / ids.length) * 100) / 100,
      ...final,
      failedAtStep: byStep,
      maintenanceNotPlanned: unexpected,
      loadBefore,
      loadAfter: load(),
    }),
  );
} finally {
  await machines.stop().catch(() => {});
  await site?.stop().catch(() => {});
  await worker.stop().catch(() => {});
  await temporal.close().catch(() => {});
  await stopTemporal?.().catch(() => {});
  await new Promise<void>((resolve) => imageServer.close(() => resolve()));
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
