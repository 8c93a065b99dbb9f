import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../db/local-postgres.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

const root = path.resolve(import.meta.dirname, '../..');
const cli = path.join(root, 'bin/better-compute.js');
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'bc-metal-walkthrough-'));
let dev: ChildProcess | undefined;
let database: TestDatabase | undefined;

/** The bash block of README.md between the metal walkthrough markers, exactly as written. */
function metalWalkthrough(): string {
  const readme = readFileSync(path.join(root, 'README.md'), 'utf8');
  const match =
    /<!-- metal-walkthrough:start -->\s*```bash\n([\s\S]*?)```\s*<!-- metal-walkthrough:end -->/.exec(readme);
  if (!match) throw new Error('README.md has no block between <!-- metal-walkthrough:start/end --> markers');
  return match[1]!;
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

describe("the README's bare-metal walkthrough", () => {
  it('deploys the demo profile to a machine of the dev site and watches every step, as written', async () => {
    database = await createTestDatabase({ max: 1 });
    dev = spawn(process.execPath, [cli, 'dev', '--sim', '0'], {
      cwd: root,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        BETTER_COMPUTE_DATA_DIR: dataDir,
        DATABASE_URL: database.url,
        BETTER_COMPUTE_API_PORT: String(await freePort()),
        BETTER_COMPUTE_GATEWAY_PORT: String(await freePort()),
        BETTER_COMPUTE_TASK_QUEUE: `metal-walkthrough-${randomBytes(4).toString('hex')}`,
        LOG_LEVEL: 'warn',
        ...(process.env.BETTER_COMPUTE_TOOLS_DIR
          ? { BETTER_COMPUTE_TOOLS_DIR: process.env.BETTER_COMPUTE_TOOLS_DIR }
          : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    dev.stdout?.on('data', (d) => (output += d));
    dev.stderr?.on('data', (d) => (output += d));
    const devJson = path.join(dataDir, 'dev.json');
    const deadline = Date.now() + 300_000; // wall time: waiting for the dev stack
    while (!existsSync(devJson)) {
      if (dev.exitCode !== null) throw new Error(`npm run dev exited with ${dev.exitCode}: ${output}`);
      if (Date.now() > deadline) throw new Error(`npm run dev did not come up: ${output}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    const info = JSON.parse(readFileSync(devJson, 'utf8'));
    expect(info.sites).toHaveLength(1);
    expect(info.sites[0].machines).toHaveLength(4);
    expect(info.profiles).toEqual([expect.objectContaining({ name: 'demo-gpu', version: 1 })]);
    const result = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
      execFile(
        'bash',
        ['-e', '-o', 'pipefail', '-c', metalWalkthrough()],
        {
          cwd: root,
          env: { PATH: process.env.PATH, HOME: process.env.HOME, BETTER_COMPUTE_DATA_DIR: dataDir },
          timeout: 600_000,
        },
        (error, stdout, stderr) =>
          resolve({ code: error ? (typeof error.code === 'number' ? error.code : 1) : 0, stdout, stderr }),
      ),
    );
    expect(result.code, `${result.stderr}\n${result.stdout.slice(-2000)}`).toBe(0);
    expect(result.stdout).toMatch(/write-image\s+ramdisk\s+succeeded/);
    expect(result.stdout).toMatch(/state:\s+succeeded/);
    expect(result.stdout).toMatch(/state:\s+deployed/);
  }, 900_000);
});
