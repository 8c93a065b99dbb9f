import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort, isPortFree } from '../../db/local-postgres.ts';
import { makeStackDir } from '../support/temp-dir.ts';

const cli = path.resolve('bin/better-compute.js');
const dataDir = makeStackDir('bc-dev-stack-');
let child: ChildProcess | undefined;

interface DevJson {
  apiUrl: string;
  temporalAddress: string;
  temporalUiUrl: string | null;
  databaseUrl: string;
  tenants: { root: { id: string; token: string }; acme: { id: string; token: string } };
  pools: Array<{ id: string; name: string; gpuModel: string; nodes: number; gpus: number }>;
  releases: Array<{ id: string; version: string; current: boolean }>;
}

async function startDev(ports: { api: number; gateway: number }): Promise<DevJson> {
  const devJson = path.join(dataDir, 'dev.json');
  rmSync(devJson, { force: true });
  child = spawn(process.execPath, [cli, 'dev', '--sim', '2', '--json'], {
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      BETTER_COMPUTE_DATA_DIR: dataDir,
      BETTER_COMPUTE_API_PORT: String(ports.api),
      BETTER_COMPUTE_GATEWAY_PORT: String(ports.gateway),
      LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (d) => (stderr += d));
  const deadline = Date.now() + 150_000;
  while (!existsSync(devJson)) {
    if (child.exitCode !== null) throw new Error(`dev exited with ${child.exitCode}: ${stderr}`);
    if (Date.now() > deadline) throw new Error(`dev did not come up: ${stderr}`);
    await new Promise((r) => setTimeout(r, 250));
  }
  return JSON.parse(readFileSync(devJson, 'utf8')) as DevJson;
}

async function stopDev() {
  const running = child!;
  const exited = new Promise<number | null>((resolve) => running.once('exit', (code) => resolve(code)));
  running.kill('SIGINT');
  return exited;
}

async function call(info: DevJson, token: string, method: string, body: unknown = {}) {
  const response = await fetch(`${info.apiUrl}/api/compute/${method}`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'x-better-compute': '1',
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  });
  return (await response.json()) as { data?: Record<string, unknown>; error?: { code: string } };
}

afterAll(async () => {
  if (child && child.exitCode === null) await stopDev();
  rmSync(dataDir, { recursive: true, force: true });
});

describe('npm run dev (better-compute dev)', () => {
  it('starts everything, writes dev.json, stops everything on Ctrl-C, and reuses its data', async () => {
    const ports = { api: await freePort(), gateway: await freePort() };
    const first = await startDev(ports);
    // The deployment secret the stack generated on its first run, readable by its owner only.
    const secretFile = path.join(dataDir, 'secret');
    const secret = readFileSync(secretFile, 'utf8').trim();
    expect(secret.length).toBeGreaterThanOrEqual(32);
    expect(statSync(secretFile).mode & 0o777).toBe(0o600);
    expect(first.apiUrl).toBe(`http://127.0.0.1:${ports.api}`);
    expect(first.temporalUiUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(first.pools).toEqual([
      expect.objectContaining({ name: 'h100', gpuModel: 'h100', nodes: 2, gpus: 16 }),
      expect.objectContaining({ name: 'h100-mig', gpuModel: 'h100', nodes: 1, gpus: 2 }),
      // Owned by acme with policy.kubernetes; its node's bcd serves an in-process kubelet stand-in.
      expect.objectContaining({ name: 'k8s', gpuModel: 'h100', nodes: 1, gpus: 4 }),
    ]);
    expect((await fetch(first.temporalUiUrl!)).status).toBe(200);
    const whoami = await call(first, first.tenants.acme.token, 'system/whoami');
    expect(whoami.data).toMatchObject({ tenantId: 'acme' });
    // The release the fleet runs and a newer signed one, ready to roll out (README: rollouts).
    expect(first.releases).toEqual([
      expect.objectContaining({ version: '0.1.0', current: true }),
      expect.objectContaining({ version: '0.2.0', current: false }),
    ]);

    expect(await stopDev()).toBe(0);
    expect(existsSync(path.join(dataDir, 'postgres', 'postmaster.pid'))).toBe(false);
    expect(await isPortFree(ports.api)).toBe(true);
    expect(await isPortFree(ports.gateway)).toBe(true);
    expect(await isPortFree(Number(first.temporalAddress.split(':')[1]))).toBe(true);

    const second = await startDev(ports);
    // Reused, so what the first run sealed (the CA key) opened again: the gateway started.
    expect(readFileSync(secretFile, 'utf8').trim()).toBe(secret);
    expect(second.pools[0]!.id).toBe(first.pools[0]!.id);
    expect(second.tenants.acme.id).toBe(first.tenants.acme.id);
    expect(second.pools[0]!.nodes).toBe(2);
    expect(second.releases).toEqual(first.releases);
    expect((await call(second, second.tenants.acme.token, 'system/whoami')).data).toMatchObject({
      tenantId: 'acme',
    });
    expect(await stopDev()).toBe(0);
  }, 400_000);
});
