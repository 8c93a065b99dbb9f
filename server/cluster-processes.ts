import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type ChildExit, childExited, stopChild } from '../db/local-postgres.ts';
import type { SupervisedServer, Watchdog } from './supervise.ts';

/** The kinds of process deploy/Procfile defines, one line each. */
export const clusterProcessKinds = [
  'temporal-history',
  'temporal-matching',
  'temporal-frontend',
  'temporal-worker',
  'api',
  'worker',
  'gateway',
  'load-balancer',
] as const;
export type ClusterProcessKind = (typeof clusterProcessKinds)[number];

export const deployDir = fileURLToPath(new URL('../deploy/', import.meta.url));
const cliEntry = fileURLToPath(new URL('../bin/better-compute.js', import.meta.url));

/**
 * deploy/Procfile's command lines by kind. Throws naming the kind a Procfile lacks, so the file and
 * this list never drift apart.
 */
export function readProcfile(file = path.join(deployDir, 'Procfile')): Record<ClusterProcessKind, string> {
  const lines = new Map<string, string>();
  for (const raw of readFileSync(file, 'utf8').split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const colon = line.indexOf(':');
    lines.set(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  const out = {} as Record<ClusterProcessKind, string>;
  for (const kind of clusterProcessKinds) {
    const command = lines.get(kind);
    if (!command) throw new Error(`${file} has no line for ${kind}: restore it from the repository`);
    out[kind] = command;
  }
  return out;
}

/**
 * A Procfile command as argv: `${VAR}` from `env` (a missing one is an error naming it), and
 * `better-compute` as this checkout's CLI run by this Node.
 */
export function commandArgv(command: string, env: Record<string, string | undefined>): string[] {
  const expanded = command.replace(/\$\{([A-Z0-9_]+)\}/g, (_, name: string) => {
    const value = env[name];
    if (value === undefined) throw new Error(`the Procfile command \`${command}\` needs ${name}`);
    return value;
  });
  const argv = expanded.split(/\s+/).filter(Boolean);
  return argv[0] === 'better-compute' ? [process.execPath, cliEntry, ...argv.slice(1)] : argv;
}

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
export function portAnswers(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host });
    socket.setTimeout(1_000);
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
    socket.once('timeout', () => {
      socket.destroy();
      resolve(false);
    });
  });
}

/** Whether the log file has a line containing `text` past byte `from`. */
export function logSaysSince(file: string, from: number, text: string): boolean {
  if (!existsSync(file)) return false;
  return readFileSync(file).subarray(from).toString('utf8').includes(text);
}

export function fileSize(file: string): number {
  return existsSync(file) ? statSync(file).size : 0;
}

/** One process of the cluster as started: what the supervisor restarts. */
export interface ClusterChild extends SupervisedServer {
  name: string;
}

/**
 * Starts `argv` as `name` in a process group of its own (a Ctrl-C reaches only the cluster, which
 * stops everything in order), registered with `watchdog`, its output appended to `logFile`, and
 * resolves once `ready()` says so. A process that exits before it is ready rejects with the end of
 * its log.
 */
export async function startClusterChild(input: {
  name: string;
  argv: string[];
  env: Record<string, string | undefined>;
  logFile: string;
  watchdog: Watchdog;
  ready: (logFrom: number) => Promise<boolean>;
  timeoutMs?: number;
  cwd?: string;
  /** The signal that stops it gracefully (default SIGTERM). */
  stopSignal?: NodeJS.Signals;
}): Promise<ClusterChild> {
  const logFrom = fileSize(input.logFile);
  const fd = openSync(input.logFile, 'a');
  const child = spawn(input.argv[0]!, input.argv.slice(1), {
    env: input.env as NodeJS.ProcessEnv,
    stdio: ['ignore', fd, fd],
    detached: true,
    ...(input.cwd ? { cwd: input.cwd } : {}),
  });
  closeSync(fd);
  const exited: Promise<ChildExit> = childExited(child);
  const pid = child.pid;
  if (pid === undefined) {
    const exit = await exited;
    throw new Error(
      `${input.name} did not start (${exit.code ?? exit.signal}): is ${input.argv[0]} installed?`,
    );
  }
  input.watchdog.watch(pid, 'SIGKILL');
  void exited.then(() => input.watchdog.unwatch(pid));
  const stop = () => stopChild(child, input.stopSignal ?? 'SIGTERM', 15_000, true);
  // wall time: how long a process may take to come up
  const deadline = Date.now() + (input.timeoutMs ?? 120_000);
  let gone: ChildExit | null = null;
  void exited.then((exit) => {
    gone = exit;
  });
  while (!(await input.ready(logFrom).catch(() => false))) {
    if (gone !== null || Date.now() > deadline) {
      // Read before stop(): a process stopped for being late exits too, and must not read as one that died.
      const died = gone as ChildExit | null;
      await stop();
      const tail = readFileSync(input.logFile).subarray(logFrom).toString('utf8').split('\n').slice(-15);
      throw new Error(
        `${input.name} ${died ? `exited (${died.code ?? died.signal})` : `did not become ready in ${input.timeoutMs ?? 120_000} ms`} before it served; the end of ${input.logFile}:\n${tail.join('\n')}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return { name: input.name, pid, exited, stop };
}
