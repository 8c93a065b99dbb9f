import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';

/**
 * The Redfish emulator of the `sushy-tools` Python package (`sushy-emulator`, its fake driver: no
 * libvirt), installed by the project itself from PyPI into a virtual environment in the tools
 * cache, the way the Temporal CLI is built there. Tests, the dev stack and `bcd site --simulate`
 * drive it as real BMCs.
 */

export const sushyToolsRequirement = 'sushy-tools==2.2.0';

/** The venv's directory inside a tools cache (`defaultToolsDir()` of temporal/dev-server.ts). */
export function sushyVenvDir(toolsDir: string): string {
  return path.join(toolsDir, 'sushy-tools', sushyToolsRequirement.replace('==', '-'));
}

/**
 * The path of `sushy-emulator`, creating the venv and pip-installing sushy-tools first when it is
 * not there (needs `python3` with venv, and PyPI). Idempotent: a finished venv is marked by a
 * stamp file, so an interrupted install is redone.
 */
export function ensureSushyEmulator(toolsDir: string, log?: Logger): string {
  const venv = sushyVenvDir(toolsDir);
  const binary = path.join(venv, 'bin', 'sushy-emulator');
  const stamp = path.join(venv, '.installed');
  if (existsSync(stamp) && existsSync(binary)) return binary;
  mkdirSync(path.dirname(venv), { recursive: true });
  log?.info({ venv, requirement: sushyToolsRequirement }, 'installing the Redfish emulator (sushy-tools)');
  const python = process.env.PYTHON ?? 'python3';
  try {
    execFileSync(python, ['-m', 'venv', '--clear', venv], { stdio: 'pipe' });
    execFileSync(
      path.join(venv, 'bin', 'pip'),
      ['install', '--quiet', '--disable-pip-version-check', sushyToolsRequirement],
      { stdio: 'pipe', timeout: 10 * 60_000 },
    );
  } catch (error) {
    const stderr = (error as { stderr?: Buffer }).stderr?.toString().slice(-2000) ?? '';
    throw new Error(
      `could not install ${sushyToolsRequirement} into ${venv} (needs python3 with venv and PyPI): ${(error as Error).message} ${stderr}`,
    );
  }
  writeFileSync(stamp, `${sushyToolsRequirement}\n`);
  log?.info({ binary }, 'the Redfish emulator is installed');
  return binary;
}

/** One emulated bare machine (a system of the fake driver). */
export interface EmulatedSystem {
  uuid: string;
  name: string;
  macs: string[];
  powerState?: 'On' | 'Off';
}

export interface RedfishEmulator {
  /** `http://127.0.0.1:<port>` */
  address: string;
  username: string;
  password: string;
  systems: EmulatedSystem[];
  /** The emulator's process id (undefined if it could not be spawned). */
  pid: number | undefined;
  stop(): Promise<void>;
}

function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

const py = (value: unknown) =>
  JSON.stringify(value)
    .replace(/\btrue\b/g, 'True')
    .replace(/\bfalse\b/g, 'False');

/**
 * Starts `sushy-emulator --fake` on a free loopback port with `systems`, basic authentication
 * (`username`/`password`, stored bcrypt-hashed as the emulator requires), its state in `dataDir`
 * (never the shared /tmp default), and, with `notifyUrl`, a PUT to that URL on every change of a
 * system (`external_notifier`). Waits until it answers.
 */
export async function startRedfishEmulator(options: {
  toolsDir: string;
  dataDir: string;
  systems: EmulatedSystem[];
  username?: string;
  password?: string;
  notifyUrl?: string;
  log?: Logger;
  /** Run it in a process group of its own, so a watchdog can stop it (`onSpawn` gets its pid). */
  detached?: boolean;
  onSpawn?: (pid: number) => void;
}): Promise<RedfishEmulator> {
  const binary = ensureSushyEmulator(options.toolsDir, options.log);
  mkdirSync(options.dataDir, { recursive: true });
  const username = options.username ?? 'admin';
  const password = options.password ?? 'password';
  const python = path.join(path.dirname(binary), 'python');
  const hash = execFileSync(
    python,
    [
      '-c',
      'import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())',
      password,
    ],
    { encoding: 'utf8' },
  ).trim();
  const authFile = path.join(options.dataDir, 'htpasswd');
  writeFileSync(authFile, `${username}:${hash}\n`, { mode: 0o600 });
  const port = await freeLoopbackPort();
  const systems = options.systems.map((s) => ({
    uuid: s.uuid,
    name: s.name,
    power_state: s.powerState ?? 'Off',
    external_notifier: Boolean(options.notifyUrl),
    nics: s.macs.map((mac) => ({ mac, ip: '' })),
  }));
  const configFile = path.join(options.dataDir, 'emulator.conf');
  writeFileSync(
    configFile,
    [
      `SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'`,
      `SUSHY_EMULATOR_LISTEN_PORT = ${port}`,
      `SUSHY_EMULATOR_AUTH_FILE = ${py(authFile)}`,
      `SUSHY_EMULATOR_STATE_DIR = ${py(path.join(options.dataDir, 'state'))}`,
      `SUSHY_EMULATOR_FAKE_DRIVER = True`,
      `SUSHY_EMULATOR_FAKE_SYSTEMS = ${py(systems)}`,
      `EXTERNAL_NOTIFICATION_URL = ${py(options.notifyUrl ?? 'http://127.0.0.1:9')}`,
      '',
    ].join('\n'),
  );
  const child: ChildProcess = spawn(binary, ['--config', configFile, '--fake'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: options.detached ?? false,
  });
  if (child.pid !== undefined) options.onSpawn?.(child.pid);
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString()).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const address = `http://127.0.0.1:${port}`;
  const auth = `Basic ${Buffer.from(`${username}:${password}`).toString('base64')}`;
  const deadline = Date.now() + 60_000; // wall time: waiting for a child process to listen
  for (;;) {
    if (child.exitCode !== null) throw new Error(`sushy-emulator exited at start: ${stderr}`);
    try {
      const response = await fetch(`${address}/redfish/v1/Systems`, {
        headers: { authorization: auth },
        signal: AbortSignal.timeout(2_000),
      });
      if (response.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`sushy-emulator did not answer on ${address} within 60 s: ${stderr}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  options.log?.info({ address, systems: systems.length }, 'Redfish emulator is up');
  return {
    address,
    username,
    password,
    systems: options.systems,
    pid: child.pid,
    stop: async () => {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
    },
  };
}
