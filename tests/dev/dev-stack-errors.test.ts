import { spawn } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { freePort, isPortFree } from '../../db/local-postgres.ts';
import { makeStackDir } from '../support/temp-dir.ts';

const cli = path.resolve('bin/better-compute.js');
const dirs: string[] = [];

function runDev(
  env: Record<string, string>,
): Promise<{ code: number | null; stderr: string; stdout: string }> {
  const dataDir = makeStackDir('bc-dev-');
  dirs.push(dataDir);
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [cli, 'dev', '--sim', '0'], {
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        BETTER_COMPUTE_DATA_DIR: dataDir,
        LOG_LEVEL: 'warn',
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (code) => resolve({ code, stderr, stdout }));
  });
}

afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('better-compute dev refuses to start with one sentence', () => {
  it('when DATABASE_URL is unreachable', async () => {
    const port = await freePort();
    const result = await runDev({ DATABASE_URL: `postgres://postgres@127.0.0.1:${port}/nothing` });
    expect(result.code).toBe(1);
    const lines = result.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^error: DATABASE_URL is not reachable .*: start that PostgreSQL server or unset DATABASE_URL/,
    );
  });

  it('when TEMPORAL_ADDRESS is unreachable, and stops the PostgreSQL it started', async () => {
    const port = await freePort();
    const result = await runDev({ TEMPORAL_ADDRESS: `127.0.0.1:${port}` });
    expect(result.code).toBe(1);
    const lines = result.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^error: Temporal at 127.0.0.1:${port} is not reachable`));
    expect(existsSync(path.join(dirs.at(-1)!, 'postgres', 'postmaster.pid'))).toBe(false);
  });

  it('when the API port is busy, and leaves nothing running', async () => {
    const blocker = net.createServer();
    const apiPort = await new Promise<number>((resolve) =>
      blocker.listen(0, '127.0.0.1', () => resolve((blocker.address() as net.AddressInfo).port)),
    );
    const gatewayPort = await freePort();
    try {
      const result = await runDev({
        TEMPORAL_ADDRESS: inject('temporalAddress'),
        BETTER_COMPUTE_API_PORT: String(apiPort),
        BETTER_COMPUTE_GATEWAY_PORT: String(gatewayPort),
      });
      expect(result.code).toBe(1);
      const lines = result.stderr.trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toContain(
        `port ${apiPort} on 127.0.0.1 is already in use: stop what uses it or set BETTER_COMPUTE_API_PORT`,
      );
      expect(existsSync(path.join(dirs.at(-1)!, 'postgres', 'postmaster.pid'))).toBe(false);
      expect(await isPortFree(gatewayPort)).toBe(true);
    } finally {
      blocker.close();
    }
  });
});
