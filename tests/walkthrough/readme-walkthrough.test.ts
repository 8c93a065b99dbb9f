import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Connection, Client as TemporalClient } from '@temporalio/client';
import { afterAll, describe, expect, it } from 'vitest';
import { createComputeClient } from '../../client/index.ts';
import { freePort } from '../../db/local-postgres.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

const root = path.resolve(import.meta.dirname, '../..');
const cli = path.join(root, 'bin/better-compute.js');
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'bc-walkthrough-'));
let dev: ChildProcess | undefined;
let database: TestDatabase | undefined;

/** The bash block of README.md between the walkthrough markers, exactly as a newcomer pastes it. */
function readmeWalkthrough(): string {
  const readme = readFileSync(path.join(root, 'README.md'), 'utf8');
  const match = /<!-- walkthrough:start -->\s*```bash\n([\s\S]*?)```\s*<!-- walkthrough:end -->/.exec(readme);
  if (!match)
    throw new Error('README.md has no walkthrough block between <!-- walkthrough:start/end --> markers');
  return match[1]!;
}

/** `npm run dev`, as the README says, with the suite's PostgreSQL and free ports. */
async function startDev(): Promise<{
  apiUrl: string;
  temporalUiUrl: string | null;
  temporalAddress: string;
  tenants: { acme: { token: string } };
}> {
  database = await createTestDatabase({ max: 1 });
  const env = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    BETTER_COMPUTE_DATA_DIR: dataDir,
    DATABASE_URL: database.url,
    BETTER_COMPUTE_API_PORT: String(await freePort()),
    BETTER_COMPUTE_GATEWAY_PORT: String(await freePort()),
    BETTER_COMPUTE_TASK_QUEUE: `walkthrough-${randomBytes(4).toString('hex')}`,
    LOG_LEVEL: 'warn',
  };
  dev = spawn(process.execPath, [cli, 'dev', '--sim', '2'], {
    cwd: root,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  dev.stdout?.on('data', (d) => (output += d));
  dev.stderr?.on('data', (d) => (output += d));
  const devJson = path.join(dataDir, 'dev.json');
  const deadline = Date.now() + 240_000;
  while (!existsSync(devJson)) {
    if (dev.exitCode !== null) throw new Error(`npm run dev exited with ${dev.exitCode}: ${output}`);
    if (Date.now() > deadline) throw new Error(`npm run dev did not come up: ${output}`);
    await new Promise((r) => setTimeout(r, 250));
  }
  return JSON.parse(readFileSync(devJson, 'utf8'));
}

function bash(script: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      'bash',
      ['-e', '-o', 'pipefail', '-c', script],
      {
        cwd: root,
        env: { PATH: process.env.PATH, HOME: process.env.HOME, BETTER_COMPUTE_DATA_DIR: dataDir },
        timeout: 300_000,
      },
      (error, stdout, stderr) =>
        resolve({ code: error ? (typeof error.code === 'number' ? error.code : 1) : 0, stdout, stderr }),
    );
  });
}

afterAll(async () => {
  if (dev && dev.exitCode === null) {
    const exited = new Promise((resolve) => dev!.once('exit', resolve));
    dev.kill('SIGINT');
    await exited;
  }
  await database?.drop();
  rmSync(dataDir, { recursive: true, force: true });
});

describe("the README's first ten minutes", () => {
  it('runs exactly as written: reserve, watch it become active, trace, extend, release, capacity returns', async () => {
    const info = await startDev();
    const result = await bash(readmeWalkthrough());
    expect(result.stderr).not.toMatch(/\n\s+at /);
    expect(result.code, result.stderr).toBe(0);
    const out = result.stdout;

    // Capacity before and after: the same 16 GPUs of two simulated servers are available.
    const capacityRows = out.split('\n').filter((l) => /^pool_\S+\s+h100\s/.test(l));
    expect(capacityRows).toHaveLength(2);
    const available = capacityRows.map((l) => l.trim().split(/\s+/).at(-2));
    expect(available).toEqual(['16', '16']);

    const id = /(rsv_[a-z2-7]+) is placed/.exec(out)?.[1] ?? /(rsv_[a-z2-7]+) is \w+/.exec(out)?.[1];
    expect(id).toBeDefined();
    expect(out).toMatch(new RegExp(`reservation\\.active\\s+→ active|${id} is active`));
    expect(out).toMatch(new RegExp(`/namespaces/default/workflows/${id}`));
    expect(out).toMatch(new RegExp(`^extended ${id} to \\d{4}-`, 'm'));
    expect(out).toMatch(new RegExp(`^${id} is released`, 'm'));

    // The workflow the trace points at is the reservation's, and it ran to completion.
    const connection = await Connection.connect({ address: info.temporalAddress });
    try {
      const handle = new TemporalClient({ connection }).workflow.getHandle(id!);
      const deadline = Date.now() + 30_000;
      let status = (await handle.describe()).status.name;
      while (status === 'RUNNING' && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 250));
        status = (await handle.describe()).status.name;
      }
      expect(status).toBe('COMPLETED');
    } finally {
      await connection.close();
    }
    // Its history, as events.list shows it: every step in order, each type in README's catalog.
    const client = createComputeClient({ baseURL: info.apiUrl, token: info.tenants.acme.token });
    // A reader shows an event once every older transaction has ended: read until the last shows.
    let types: string[] = [];
    await expect
      .poll(
        async () => {
          const history = await client.events.list({ subject: `reservation/${id}` });
          types = history.items.map((e) => e.type);
          return types.includes('reservation.released');
        },
        { timeout: 30_000, interval: 100 },
      )
      .toBe(true);
    const inOrder = [
      'reservation.placed',
      'reservation.binding',
      'reservation.active',
      'reservation.extended',
      'reservation.released',
    ];
    expect(types.filter((t) => inOrder.includes(t))).toEqual(inOrder);
    const catalog =
      readFileSync(path.join(root, 'README.md'), 'utf8').split('**The event catalog.**')[1] ?? '';
    for (const type of types)
      expect(catalog, `${type} is missing from README's event catalog`).toContain(`\`${type}\``);

    if (info.temporalUiUrl) {
      expect((await fetch(`${info.temporalUiUrl}/namespaces/default/workflows/${id}`)).status).toBe(200);
    }
  }, 420_000);
});
