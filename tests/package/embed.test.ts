import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import { registerReadyNodes } from '../../db/nodes/fleet.ts';
import { createDb } from '../../db/pool.ts';

// The package as a user gets it: `npm pack` (which builds dist/), the tarball installed into a
// fresh project outside this repository, and scripts there that can only see what was installed.

const root = path.resolve(import.meta.dirname, '../..');
let work: string;
let project: string;
let databaseUrl: string;
let databaseName: string;

interface Run {
  stdout: string;
  stderr: string;
}

function run(
  command: string,
  args: string[],
  options: { cwd: string; env?: NodeJS.ProcessEnv },
): Promise<Run> {
  return new Promise((resolve, reject) => {
    execFile(
      command,
      args,
      { cwd: options.cwd, env: options.env ?? process.env, maxBuffer: 64 * 1024 * 1024 },
      (error, stdout, stderr) => {
        if (error) {
          reject(new Error(`${command} ${args.join(' ')} failed: ${error.message}\n${stdout}\n${stderr}`));
        } else resolve({ stdout, stderr });
      },
    );
  });
}

/** Runs one of the project's scripts with nothing of this repository in reach; answers what it wrote. */
async function runScript(name: string, input: Record<string, unknown>): Promise<Record<string, unknown>> {
  const resultFile = path.join(work, `${name}.json`);
  // Only PATH and HOME: no NODE_OPTIONS, no tsx loader, no NODE_PATH pointing back here.
  const env = { PATH: process.env.PATH, HOME: process.env.HOME };
  await run(process.execPath, [name, JSON.stringify({ ...input, resultFile })], { cwd: project, env });
  return JSON.parse(readFileSync(resultFile, 'utf8'));
}

/** Migrates a fresh database and seeds, through the package's own API, what a reservation needs. */
const setupScript = `
import { betterCompute } from 'better-compute';

const { databaseUrl, resultFile } = JSON.parse(process.argv[2]);
const compute = betterCompute({ database: databaseUrl, secret: 'a'.repeat(32), logLevel: 'warn' });
const boot = await compute.initialize();
const root = { token: boot.rootAdminToken };
const admin = compute.api.admin;
await admin.createTenant(root, { id: 'acme', name: 'Acme Corp' });
const person = await admin.createIdentity(root, {
  tenantId: 'acme', kind: 'person', name: 'acme-admin', email: 'admin@acme.example', roles: ['admin'],
});
const token = await admin.createToken(root, { identityId: person.id, name: 'embed-test' });
const site = await admin.createSite(root, { name: 'embed-site', region: 'eu-central-1' });
const pool = await admin.createPool(root, { siteId: site.id, name: 'h100', gpuModel: 'h100' });
await admin.offer(root, { poolId: pool.id, tenantId: 'acme', quota: { gpu: 16 } });
await compute.stop();
const { writeFileSync } = await import('node:fs');
writeFileSync(resultFile, JSON.stringify({
  migrationsApplied: boot.migrationsApplied, rootTenantId: boot.rootTenantId,
  acmeToken: token.token, siteId: site.id, poolId: pool.id,
}));
`;

/**
 * The embedder's own process: betterCompute() with Temporal, handler mounted in its own node:http
 * server, a reservation created in process and read back over HTTP by the typed client, until the
 * package's own worker has moved it on.
 */
const reserveScript = `
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { betterCompute } from 'better-compute';
import { createComputeClient } from 'better-compute/client';

const { databaseUrl, temporal, acmeToken, poolId, resultFile } = JSON.parse(process.argv[2]);
const compute = betterCompute({ database: databaseUrl, temporal, secret: 'embedder-deployment-secret-'.padEnd(40, 'x'), logLevel: 'warn' });
const again = await compute.initialize();
await compute.start();

// Mounting the fetch handler in a plain node:http server, as any embedder would.
const server = createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers.set(name, Array.isArray(value) ? value.join(', ') : value);
  }
  const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
  const response = await compute.handler(
    new Request(new URL(req.url, 'http://' + req.headers.host), {
      method: req.method, headers, ...(hasBody ? { body: Buffer.concat(chunks) } : {}),
    }),
  );
  res.writeHead(response.status, Object.fromEntries(response.headers));
  res.end(Buffer.from(await response.arrayBuffer()));
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const baseURL = 'http://127.0.0.1:' + server.address().port;

const created = await compute.api.reservations.create({ token: acmeToken }, {
  tenantId: 'acme', poolId, devices: [{ class: 'gpu', count: 2 }], duration: '1h', idempotencyKey: 'embed-1',
});
const client = createComputeClient({ baseURL, token: acmeToken });
const read = await client.reservations.get({ tenantId: 'acme', reservationId: created.id });
let refused = null;
try {
  await client.reservations.get({ tenantId: 'acme', reservationId: 'rsv_missing' });
} catch (error) {
  refused = { name: error.name, code: error.code, status: error.status };
}
// The lifecycle runs in this process's worker: placed, then binding (no daemon ever binds here).
let later = read;
const deadline = Date.now() + 60_000; // wall time: a bounded wait for the worker
while (later.state === 'placed' && Date.now() < deadline) {
  await new Promise((r) => setTimeout(r, 200));
  later = await client.reservations.get({ tenantId: 'acme', reservationId: created.id });
}
server.close();
await compute.stop();
writeFileSync(resultFile, JSON.stringify({ migrationsApplied: again.migrationsApplied, created, read, later, refused }));
`;

/** Types as a TypeScript user of the package sees them: inferred, not any. */
const consumerSource = `
import { type BetterCompute, betterCompute } from 'better-compute';
import { ComputeClientError, createComputeClient } from 'better-compute/client';
import { signWebhook } from 'better-compute/webhooks';

const compute: BetterCompute = betterCompute({ database: 'postgres://127.0.0.1/compute' });

export async function reserve(token: string): Promise<string> {
  const created = await compute.api.reservations.create(
    { token },
    { tenantId: 'acme', poolId: 'pool_1', devices: [{ class: 'gpu', count: 1 }], duration: '1h', idempotencyKey: 'k' },
  );
  const state: string = created.state;
  // @ts-expect-error an input field the schema does not have
  await compute.api.reservations.get({ token }, { tenantId: 'acme', reservationId: created.id, bogus: 1 });
  const client = createComputeClient<BetterCompute>({ baseURL: 'http://127.0.0.1:7070', token });
  const read = await client.reservations.get({ tenantId: 'acme', reservationId: created.id });
  // @ts-expect-error no such API group
  client.nosuch.get();
  const response: Response = await compute.handler(new Request('http://127.0.0.1/healthz'));
  const error = new ComputeClientError({ code: 'NOT_FOUND', message: 'x', status: 404, method: 'a.b' });
  return [state, read.id, response.status, error.code, signWebhook('whsec_a2V5', 'id', 1, '{}')].join();
}
`;

beforeAll(async () => {
  work = mkdtempSync(path.join(tmpdir(), 'bc-package-'));
  project = path.join(work, 'app');

  const packed = await run('npm', ['pack', '--json', '--pack-destination', work], { cwd: root });
  const [{ filename }] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as [
    { filename: string },
  ];
  const tarball = path.join(work, filename);

  mkdirSync(project);
  const repoPackage = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'));
  writeFileSync(
    path.join(project, 'package.json'),
    JSON.stringify({
      name: 'embeds-better-compute',
      private: true,
      type: 'module',
      dependencies: { 'better-compute': `file:${tarball}` },
      allowScripts: repoPackage.allowScripts,
    }),
  );
  writeFileSync(path.join(project, 'setup.mjs'), setupScript);
  writeFileSync(path.join(project, 'reserve.mjs'), reserveScript);
  writeFileSync(path.join(project, 'consumer.ts'), consumerSource);
  const install = ['install', '--no-audit', '--no-fund', '--loglevel=error'];
  // The npm cache of a machine that ran `npm ci` here holds every package: offline first.
  await run('npm', [...install, '--offline'], { cwd: project }).catch(() =>
    run('npm', [...install, '--prefer-offline'], { cwd: project }),
  );

  const adminUrl = inject('postgresAdminUrl');
  databaseName = `bc_embed_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    // Empty, not a clone of the migrated template: initialize() migrates it.
    await admin.query(`CREATE DATABASE "${databaseName}"`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${databaseName}`;
  databaseUrl = url.toString();
}, 600_000);

afterAll(async () => {
  if (databaseName) {
    const admin = new pg.Client({ connectionString: inject('postgresAdminUrl') });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS "${databaseName}" WITH (FORCE)`).catch(() => {});
    await admin.end();
  }
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the packed package', () => {
  test('holds compiled JavaScript and type declarations, no TypeScript sources', () => {
    const installed = path.join(project, 'node_modules', 'better-compute');
    const files = readdirSync(installed, { recursive: true }).map(String);
    expect(files).toContain(path.join('dist', 'index.js'));
    expect(files).toContain(path.join('dist', 'index.d.ts'));
    expect(files).toContain(path.join('dist', 'client', 'index.js'));
    expect(files).toContain(path.join('dist', 'events', 'webhook-signature.js'));
    expect(files.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);
    expect(files.some((f) => f.includes('.test.') || f.startsWith('tests'))).toBe(false);
  });

  test('embeds: initialize on a fresh database, handler in its own server, api create, client read', async () => {
    const setup = await runScript('setup.mjs', { databaseUrl });
    expect((setup.migrationsApplied as string[]).length).toBeGreaterThan(0);
    expect(setup.rootTenantId).toBe('platform');

    // Two ready 8-GPU nodes in the pool, as a joined fleet would have them.
    const db = createDb(databaseUrl, { max: 1 });
    try {
      await registerReadyNodes(db.db, {
        siteId: setup.siteId as string,
        poolId: setup.poolId as string,
        count: 2,
        namePrefix: 'embed',
      });
    } finally {
      await db.close();
    }

    const taskQueue = `embed-${randomBytes(4).toString('hex')}`;
    const result = await runScript('reserve.mjs', {
      databaseUrl,
      temporal: { address: inject('temporalAddress'), taskQueue, sweeper: false },
      acmeToken: setup.acmeToken,
      poolId: setup.poolId,
    });
    const created = result.created as { id: string; state: string; tenantId: string };
    expect(result.migrationsApplied).toEqual([]);
    expect(created.id).toMatch(/^rsv_/);
    expect(created.state).toBe('placed');
    expect(result.read).toEqual(created);
    expect(result.refused).toEqual({ name: 'ComputeClientError', code: 'NOT_FOUND', status: 404 });
    expect((result.later as { state: string }).state).toBe('binding');
  });

  test('its types: compute.api and the client are inferred from the schemas', async () => {
    writeFileSync(
      path.join(project, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          lib: ['ES2023', 'DOM'],
          types: [],
          strict: true,
          noEmit: true,
          skipLibCheck: true,
        },
        files: ['consumer.ts'],
      }),
    );
    const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');
    await expect(run(process.execPath, [tsc, '-p', project], { cwd: project })).resolves.toBeDefined();
  });

  test('its bins run the compiled code', async () => {
    const bin = path.join(project, 'node_modules', '.bin');
    const cli = await run(path.join(bin, 'better-compute'), ['--help'], { cwd: project });
    expect(cli.stdout).toContain('Usage: better-compute');
    const bcd = await run(path.join(bin, 'bcd'), ['--help'], { cwd: project });
    expect(bcd.stdout).toContain('Usage: bcd');
  });
});
