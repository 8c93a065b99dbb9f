import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../db/local-postgres.ts';
import { waitForTemporal } from '../../temporal/dev-server.ts';
import { eventually } from '../support/eventually.ts';
import { makeStackDir } from '../support/temp-dir.ts';

/**
 * The dev stack supervises what it started: a PostgreSQL or Temporal dev server that dies is
 * restarted at the same address with one line saying so; Ctrl-C stops the control plane before
 * them (no "database system is shutting down" noise); and they never outlive the dev stack, not
 * even when it is SIGKILLed (its watchdog stops them).
 */
const cli = path.resolve('bin/better-compute.js');
const dataDir = makeStackDir('bc-dev-supervise-');
let child: ChildProcess | undefined;
let output = '';

interface DevJson {
  sites: unknown[];
  apiUrl: string;
  temporalAddress: string;
  databaseUrl: string;
  tenants: { acme: { token: string } };
}

async function startDev(ports: { api: number; gateway: number }): Promise<DevJson> {
  const devJson = path.join(dataDir, 'dev.json');
  rmSync(devJson, { force: true });
  output = '';
  child = spawn(process.execPath, [cli, 'dev', '--sim', '1', '--json'], {
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
  child.stdout?.on('data', (d) => (output += d));
  child.stderr?.on('data', (d) => (output += d));
  const running = child;
  await eventually(async () => {
    if (running.exitCode !== null) throw new Error(`dev exited with ${running.exitCode}: ${output}`);
    return existsSync(devJson);
  }, 150_000);
  return JSON.parse(readFileSync(devJson, 'utf8')) as DevJson;
}

/** Whether `pid` runs (a zombie waiting for its parent to reap it does not). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

function postgresPid(): number {
  return Number(readFileSync(path.join(dataDir, 'postgres', 'postmaster.pid'), 'utf8').split('\n')[0]);
}

/** The live processes whose command line holds every one of `parts`. */
function pidsWith(...parts: string[]): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (parts.every((p) => cmdline.includes(p)) && alive(Number(entry))) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

function temporalPid(): number {
  const pid = pidsWith('start-dev', path.join(dataDir, 'temporal', 'temporal.db'))[0];
  if (pid === undefined) throw new Error('no Temporal dev server of this dev stack runs');
  return pid;
}

/** The dev stack's Redfish emulator (none when python3's venv or PyPI is missing here). */
const emulatorPids = () => pidsWith('sushy-emulator', path.join(dataDir, 'metal', 'bmc'));

async function whoami(info: DevJson) {
  const response = await fetch(`${info.apiUrl}/api/compute/system/whoami`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${info.tenants.acme.token}`,
      'x-better-compute': '1',
      'content-type': 'application/json',
    },
    body: '{}',
  });
  return (await response.json()) as { data?: { tenantId: string }; error?: { code: string } };
}

function restartLines(server: string): number {
  return output
    .split('\n')
    .filter((l) => l.includes(`${server} stopped unexpectedly`) && l.includes('restarted')).length;
}

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child!.once('exit', resolve));
    child.kill('SIGINT');
    await exited;
  }
  rmSync(dataDir, { recursive: true, force: true });
});

describe('the dev stack supervises PostgreSQL and the Temporal dev server', () => {
  it('restarts them when they die, stops them after the control plane, and never leaves them behind', async () => {
    const ports = { api: await freePort(), gateway: await freePort() };
    const info = await startDev(ports);

    // Temporal dies: it is back at the same address, and one line says so.
    const temporal = temporalPid();
    process.kill(temporal, 'SIGKILL');
    await eventually(async () => restartLines('the Temporal dev server') === 1, 90_000);
    expect(temporalPid()).not.toBe(temporal);
    await waitForTemporal(info.temporalAddress, 30_000);

    // PostgreSQL dies: it is back on the same port and the API answers again.
    const postgres = postgresPid();
    process.kill(postgres, 'SIGKILL');
    await eventually(async () => restartLines('PostgreSQL') === 1, 90_000);
    expect(postgresPid()).not.toBe(postgres);
    await eventually(async () => (await whoami(info)).data?.tenantId === 'acme', 30_000);

    // Ctrl-C: the control plane stops first, so nothing complains about a database going away.
    const exited = new Promise<number | null>((resolve) => child!.once('exit', (code) => resolve(code)));
    const before = output.length;
    const runningTemporal = temporalPid();
    child!.kill('SIGINT');
    expect(await exited).toBe(0);
    expect(output.slice(before)).not.toMatch(/shutting down|tick failed|"level":50/);
    expect(existsSync(path.join(dataDir, 'postgres', 'postmaster.pid'))).toBe(false);
    // The process, not its port: once it is gone, any process's outgoing connection may take the
    // port number as its own (the port was free, so it is in the range those are drawn from).
    expect(alive(runningTemporal)).toBe(false);

    // SIGKILLed, the dev stack cannot stop them itself: its watchdog does.
    const restarted = await startDev(ports);
    const [pg, tp] = [postgresPid(), temporalPid()];
    const emulators = emulatorPids();
    if (restarted.sites.length > 0) expect(emulators).toHaveLength(1);
    child!.kill('SIGKILL');
    await eventually(async () => !alive(pg) && !alive(tp) && emulators.every((pid) => !alive(pid)), 30_000);
  }, 400_000);
});
