import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Connection } from '@temporalio/client';
import type { Logger } from '../core/logger.ts';
import { type ChildExit, childExited, freePort, isPortFree, stopChild } from '../db/local-postgres.ts';
import { searchAttributeFlags } from '../workflows/search-attributes.ts';

/** The newest Temporal CLI release whose module `go install` accepts (later ones use `replace`). */
export const temporalCliModule = 'github.com/temporalio/cli/cmd/temporal@v1.5.1';

export interface TemporalDevServer {
  address: string;
  uiUrl: string | null;
  /** The frontend's port, and the Web UI's (null when headless): a restart takes them again. */
  port: number;
  uiPort: number | null;
  pid: number;
  /** Settles when the server exits, whoever stopped it. */
  exited: Promise<ChildExit>;
  stop(): Promise<void>;
}

/** The tools cache, outside the repository so every checkout shares one build. */
export function defaultToolsDir(): string {
  return path.join(
    process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), '.cache'),
    'better-compute',
    'tools',
  );
}

function onPath(binary: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    const candidate = path.join(dir, binary);
    if (dir && existsSync(candidate)) return candidate;
  }
  return undefined;
}

/** Go on PATH or where its installer puts it, if anywhere. */
export function findGo(): string | undefined {
  return onPath('go') ?? (existsSync('/usr/local/go/bin/go') ? '/usr/local/go/bin/go' : undefined);
}

/**
 * `go install`s `modules` into `gobin` at the lowest CPU priority (`nice -n 19`, so a build on a
 * shared machine never starves anything else), logging progress every ten seconds; rejects with
 * the build's last lines when it fails.
 */
export async function goInstall(input: {
  go: string;
  modules: string[];
  gobin: string;
  what: string;
  log: Logger;
  /** The main module to build in (its go.mod picks the versions); none: `modules` carry `@version`. */
  cwd?: string;
}): Promise<void> {
  mkdirSync(input.gobin, { recursive: true });
  const nice = onPath('nice');
  const argv = [input.go, 'install', '-v', ...input.modules];
  await new Promise<void>((resolve, reject) => {
    const child = spawn(nice ?? argv[0]!, nice ? ['-n', '19', ...argv] : argv.slice(1), {
      env: { ...process.env, GOBIN: input.gobin, GOFLAGS: '-mod=mod' },
      stdio: ['ignore', 'ignore', 'pipe'],
      ...(input.cwd ? { cwd: input.cwd } : {}),
    });
    let packages = 0;
    // wall time: progress lines every ten seconds
    let lastReport = Date.now();
    const tail: string[] = [];
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      for (const line of chunk.split('\n').filter(Boolean)) {
        packages += 1;
        tail.push(line);
        if (tail.length > 20) tail.shift();
        if (Date.now() - lastReport > 10_000) {
          lastReport = Date.now();
          input.log.info({ packagesBuilt: packages, current: line }, `still building ${input.what}`);
        }
      }
    });
    child.once('error', reject);
    child.once('exit', (code) =>
      code === 0
        ? resolve()
        : reject(new Error(`go install ${input.modules.join(' ')} failed:\n${tail.join('\n')}`)),
    );
  });
}

/**
 * Finds the Temporal CLI on PATH or in the tools cache; when absent and Go is available, builds it
 * there with `go install`, logging progress. Throws one sentence saying what to install otherwise.
 */
export async function ensureTemporalCli(toolsDir: string, log: Logger): Promise<string> {
  const cached = path.join(toolsDir, 'bin', 'temporal');
  const found = onPath('temporal') ?? (existsSync(cached) ? cached : undefined);
  if (found) return found;
  const go = findGo();
  if (!go) {
    throw new Error(
      'the Temporal CLI is not installed and Go is not available to build it: install Go 1.23 or later (or the `temporal` CLI on PATH), or set TEMPORAL_ADDRESS to an existing Temporal server',
    );
  }
  log.info(
    { module: temporalCliModule, into: cached },
    'building the Temporal CLI with go install (first run only; a few minutes)',
  );
  await goInstall({
    go,
    modules: [temporalCliModule],
    gobin: path.join(toolsDir, 'bin'),
    what: 'the Temporal CLI',
    log,
  });
  log.info({ path: cached }, 'the Temporal CLI is built');
  return cached;
}

async function preferredPort(port: number): Promise<number> {
  return (await isPortFree(port)) ? port : freePort();
}

/** Waits until a Temporal frontend at `address` answers. */
export async function waitForTemporal(
  address: string,
  timeoutMs: number,
  child?: ChildProcess,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    if (child && child.exitCode !== null) break;
    try {
      const connection = await Connection.connect({ address, connectTimeout: 1_000 });
      try {
        await connection.workflowService.getSystemInfo({});
        return;
      } finally {
        await connection.close();
      }
    } catch (error) {
      lastError = error;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  throw new Error(
    `Temporal at ${address} is not reachable (${lastError instanceof Error ? lastError.message : 'the server exited'}): start it or check TEMPORAL_ADDRESS`,
  );
}

/** The usual ports were taken by another server as this one started (see startTemporalDevServer). */
class UsualPortsTaken extends Error {}

/** What startTemporalDevServer is given. */
export interface TemporalDevServerOptions {
  dataDir: string;
  toolsDir: string;
  log: Logger;
  headless?: boolean;
  /** Keep workflows in SQLite under dataDir across restarts (the dev stack); tests run in memory. */
  persist?: boolean;
  port?: number;
  uiPort?: number;
  /**
   * Run the server in a process group of its own, so a Ctrl-C of this process's terminal does not
   * reach it (the caller stops it in order).
   */
  detached?: boolean;
  /** Told the server's pid as soon as it is spawned (a watchdog registers it). */
  onSpawn?: (pid: number) => void;
}

/**
 * Starts `temporal server start-dev` (SQLite in `dataDir`, the Web UI unless `headless`) on free
 * loopback ports, registers the search attributes, and waits until its frontend answers.
 * Unless `port` is given, a server with its Web UI takes the usual ports (7233, and 8233 for the
 * Web UI) when they are free, so bookmarks keep working; when another server takes them between
 * that look and this one's start (two dev stacks started at once), it starts again on free ports.
 */
export async function startTemporalDevServer(options: TemporalDevServerOptions): Promise<TemporalDevServer> {
  const cli = await ensureTemporalCli(options.toolsDir, options.log);
  mkdirSync(options.dataDir, { recursive: true });
  if (options.headless) return startOn(cli, options, options.port ?? (await freePort()), undefined);
  if (options.port !== undefined) {
    return startOn(cli, options, options.port, options.uiPort ?? (await preferredPort(8233)));
  }
  const ports = { port: await preferredPort(7233), uiPort: options.uiPort ?? (await preferredPort(8233)) };
  const usual = ports.port === 7233 || ports.uiPort === 8233;
  try {
    return await startOn(cli, options, ports.port, ports.uiPort, usual);
  } catch (error) {
    if (!(error instanceof UsualPortsTaken)) throw error;
    options.log.info(
      { port: ports.port, uiPort: ports.uiPort },
      'another server took the usual Temporal ports as this one started; starting it on free ports',
    );
    return startOn(cli, options, await freePort(), options.uiPort ?? (await freePort()));
  }
}

/** Marks a dev server's SQLite file as created with one partition per task queue. */
const onePartitionMarker = 'task-queues-one-partition';

/**
 * One partition per task queue instead of Temporal's four: partitions spread a queue over several
 * matching hosts, and this server is one process. With four, a backlog of workflow tasks (lifecycle
 * starts faster than the worker takes them) was written to and read from each partition and
 * forwarded between them: 1,000 lifecycles started and looked 34 a second, at 27 ms of the
 * server's CPU each; with one, 42 a second at 21 ms (bench/lifecycle.ts, bench/README.md). Tasks
 * already stored in partitions 1 to 3 by a server started before would never be read with one
 * read partition, so a SQLite file created before this setting keeps reading four (and writes
 * one: new tasks go to partition 0).
 */
function taskQueuePartitionFlags(options: TemporalDevServerOptions): string[] {
  const writeOne = ['--dynamic-config-value', 'matching.numTaskqueueWritePartitions=1'];
  const readOne = ['--dynamic-config-value', 'matching.numTaskqueueReadPartitions=1'];
  if (options.persist === false) return [...writeOne, ...readOne];
  const marker = path.join(options.dataDir, onePartitionMarker);
  if (existsSync(marker)) return [...writeOne, ...readOne];
  if (existsSync(path.join(options.dataDir, 'temporal.db'))) return writeOne;
  writeFileSync(marker, 'the SQLite file of this folder was created with one partition per task queue\n');
  return [...writeOne, ...readOne];
}

/**
 * One start of the server on `port` (and its Web UI on `uiPort`, none when undefined). With
 * `usual`, a server that exits before it answers, or a frontend on `port` that is not this
 * server's, throws UsualPortsTaken.
 */
async function startOn(
  cli: string,
  options: TemporalDevServerOptions,
  port: number,
  uiPort: number | undefined,
  usual = false,
): Promise<TemporalDevServer> {
  const args = [
    'server',
    'start-dev',
    ...taskQueuePartitionFlags(options),
    '--ip',
    '127.0.0.1',
    '--port',
    String(port),
    ...(options.persist === false ? [] : ['--db-filename', path.join(options.dataDir, 'temporal.db')]),
    '--log-level',
    'warn',
    ...searchAttributeFlags.flatMap((flag) => ['--search-attribute', flag]),
    ...(uiPort ? ['--ui-port', String(uiPort), '--ui-ip', '127.0.0.1'] : ['--headless']),
  ];
  const logFile = path.join(options.dataDir, 'temporal.log');
  // The server writes its log itself, so it never depends on a pipe through this process.
  const logFd = openSync(logFile, 'a');
  const detached = options.detached === true;
  const child = spawn(cli, args, { stdio: ['ignore', logFd, logFd], detached });
  closeSync(logFd);
  const exited = childExited(child);
  if (child.pid !== undefined) options.onSpawn?.(child.pid);
  const address = `127.0.0.1:${port}`;
  try {
    await waitForTemporal(address, 90_000, child);
    // The frontend that answered may be another server's, on the port this one could not take.
    if (usual && !listensOn(child.pid!, port)) throw new UsualPortsTaken(`${address} is another server's`);
  } catch (error) {
    const exitedFirst = child.exitCode !== null || child.signalCode !== null;
    await stopChild(child, 'SIGKILL', 1_000, detached);
    if (usual && (error instanceof UsualPortsTaken || exitedFirst)) {
      throw new UsualPortsTaken(`${(error as Error).message}; see ${logFile}`);
    }
    throw new Error(`${(error as Error).message}; see ${logFile}`);
  }
  options.log.info(
    { address, uiUrl: uiPort ? `http://127.0.0.1:${uiPort}` : null },
    'Temporal dev server is up',
  );
  return {
    address,
    uiUrl: uiPort ? `http://127.0.0.1:${uiPort}` : null,
    port,
    uiPort: uiPort ?? null,
    pid: child.pid!,
    exited,
    stop: () => stopChild(child, 'SIGTERM', 10_000, detached),
  };
}

/**
 * Whether the socket listening on 127.0.0.1:`port` is one of `pid`'s (Linux's /proc; true where
 * that cannot tell).
 */
function listensOn(pid: number, port: number): boolean {
  let table: string;
  try {
    table = readFileSync('/proc/net/tcp', 'utf8');
  } catch {
    return true;
  }
  const local = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const sockets = new Set(
    table
      .split('\n')
      .slice(1)
      .map((line) => line.trim().split(/\s+/))
      // local address, state LISTEN (0A), inode
      .filter((fields) => fields[1] === local && fields[3] === '0A')
      .map((fields) => `socket:[${fields[9]}]`),
  );
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return true;
  }
  return fds.some((fd) => {
    try {
      return sockets.has(readlinkSync(`/proc/${pid}/fd/${fd}`));
    } catch {
      return false;
    }
  });
}

export function temporalCliVersion(cli: string): string {
  return execFileSync(cli, ['--version'], { encoding: 'utf8' }).trim();
}
