import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import { findGo, goInstall, temporalCliModule } from '../temporal/dev-server.ts';

/** The Temporal server the CLI v1.5.1 embeds: its go.mod has no `replace`, so `go install` works. */
export const temporalServerVersion = 'v1.29.1';
const temporalServerPackages = ['go.temporal.io/server/cmd/server', 'go.temporal.io/server/cmd/tools/sql'];
/** The CLI's module, whose go.mod the server is built with (see `ensureTemporalServer`). */
const cliModule = temporalCliModule.replace('/cmd/temporal@', '@');

/** The Temporal server and its SQL schema tool, as built into the tools cache. */
export interface TemporalServerBinaries {
  server: string;
  sqlTool: string;
  version: string;
}

/**
 * The Temporal server (`server`) and its SQL schema tool (`sql`) of `temporalServerVersion`, built
 * with `go install` into `<toolsDir>/temporal-server-<version>/` the first time (at the lowest CPU
 * priority; several minutes on two cores) and reused afterwards. Throws one sentence saying what to
 * install when Go is missing.
 */
export async function ensureTemporalServer(toolsDir: string, log: Logger): Promise<TemporalServerBinaries> {
  const dir = path.join(toolsDir, `temporal-server-${temporalServerVersion}`);
  const binaries = {
    server: path.join(dir, 'server'),
    sqlTool: path.join(dir, 'sql'),
    version: temporalServerVersion,
  };
  if (existsSync(binaries.server) && existsSync(binaries.sqlTool)) return binaries;
  const go = findGo();
  if (!go) {
    throw new Error(
      `the Temporal server ${temporalServerVersion} is not built and Go is not available to build it: install Go 1.23 or later, or run against an existing Temporal cluster (TEMPORAL_ADDRESS)`,
    );
  }
  log.info(
    { packages: temporalServerPackages, with: cliModule, into: dir },
    'building the Temporal server with go install (first run only; minutes after the Temporal CLI)',
  );
  // wall time: only to say how long the build took
  const started = Date.now();
  // Built beside the cache entry and renamed into place, so an interrupted build is never taken.
  const building = `${dir}.building-${process.pid}`;
  rmSync(building, { recursive: true, force: true });
  // Built in a module with the CLI's go.mod: the versions the CLI's dev server embeds, so every
  // package the CLI's build compiled comes from Go's build cache (about 99%; the server's own
  // go.mod picks older golang.org/x/* and only about a third would). That go.mod pins the server.
  const module = path.join(building, 'module');
  mkdirSync(module, { recursive: true });
  const cli = JSON.parse(
    execFileSync(go, ['mod', 'download', '-json', cliModule], { encoding: 'utf8', cwd: module }),
  ) as { GoMod: string; Dir: string };
  const goMod = readFileSync(cli.GoMod, 'utf8');
  if (
    !new RegExp(`go\\.temporal\\.io/server ${temporalServerVersion.replace(/\./g, '\\.')}\\b`).test(goMod)
  ) {
    throw new Error(
      `${cliModule} does not pin go.temporal.io/server ${temporalServerVersion}: set temporalServerVersion in server/cluster-tools.ts to the version its go.mod requires`,
    );
  }
  writeFileSync(
    path.join(module, 'go.mod'),
    goMod.replace(/^module .*$/m, 'module better-compute.local/temporal-server'),
  );
  writeFileSync(path.join(module, 'go.sum'), readFileSync(path.join(cli.Dir, 'go.sum')));
  await goInstall({
    go,
    modules: temporalServerPackages,
    gobin: building,
    cwd: module,
    what: 'the Temporal server',
    log,
  });
  rmSync(module, { recursive: true, force: true });
  rmSync(dir, { recursive: true, force: true });
  renameSync(building, dir);
  log.info({ dir, seconds: Math.round((Date.now() - started) / 1000) }, 'the Temporal server is built');
  return binaries;
}

/** The Debian package of the load balancer, fetched (never installed) into the tools cache. */
const haproxyPackage = 'haproxy';

/** A runnable HAProxy: the binary and the library folder it needs on LD_LIBRARY_PATH. */
export interface HaproxyBinary {
  binary: string;
  libraryPath: string;
  version: string;
}

function installedPackage(name: string): boolean {
  try {
    const status = execFileSync('dpkg-query', ['-W', '-f=${Status}', name], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    return status.includes('install ok installed');
  } catch {
    return false;
  }
}

/** The library packages `name` depends on directly (alternatives: the first one). */
function libraryDependencies(name: string): string[] {
  const out = execFileSync('apt-cache', ['depends', '--no-recommends', '--no-suggests', name], {
    encoding: 'utf8',
  });
  return out
    .split('\n')
    .map((line) => /^\s*\|?Depends: ([^\s<>]+)/.exec(line)?.[1])
    .filter((dep): dep is string => dep !== undefined && dep.startsWith('lib'));
}

/**
 * HAProxy from Debian's packages, without root: `apt-get download` of haproxy and of every library
 * package it needs that this machine lacks (followed transitively), each unpacked with `dpkg -x`
 * into `<toolsDir>/haproxy/`, and run with that folder's libraries on LD_LIBRARY_PATH. Fetched once.
 */
export function ensureHaproxy(toolsDir: string, log: Logger): HaproxyBinary {
  const dir = path.join(toolsDir, 'haproxy');
  const root = path.join(dir, 'root');
  const binary = path.join(root, 'usr', 'sbin', 'haproxy');
  const libraryPath = path.join(root, 'usr', 'lib', 'x86_64-linux-gnu');
  const run = (): HaproxyBinary => {
    const version = execFileSync(binary, ['-v'], {
      encoding: 'utf8',
      env: { ...process.env, LD_LIBRARY_PATH: libraryPath },
    }).split('\n')[0]!;
    return { binary, libraryPath, version };
  };
  if (existsSync(binary)) return run();
  log.info({ into: dir }, 'fetching HAProxy from the Debian packages (first run only)');
  const building = `${dir}.building-${process.pid}`;
  const debs = path.join(building, 'debs');
  rmSync(building, { recursive: true, force: true });
  mkdirSync(debs, { recursive: true });
  const wanted = new Set<string>([haproxyPackage]);
  const queue = [haproxyPackage];
  while (queue.length) {
    for (const dep of libraryDependencies(queue.shift()!)) {
      if (wanted.has(dep) || installedPackage(dep)) continue;
      wanted.add(dep);
      queue.push(dep);
    }
  }
  try {
    execFileSync('apt-get', ['download', ...wanted], { cwd: debs, stdio: 'pipe' });
  } catch (error) {
    throw new Error(
      `apt-get download ${[...wanted].join(' ')} failed (${(error as Error).message.split('\n')[0]}): run \`apt-get update\` first, or install haproxy and put it on PATH`,
    );
  }
  for (const deb of readdirSync(debs).filter((f) => f.endsWith('.deb'))) {
    execFileSync('dpkg', ['-x', path.join(debs, deb), path.join(building, 'root')], { stdio: 'pipe' });
  }
  rmSync(debs, { recursive: true, force: true });
  rmSync(dir, { recursive: true, force: true });
  renameSync(building, dir);
  const fetched = run();
  log.info({ packages: [...wanted], version: fetched.version }, 'HAProxy is ready');
  return fetched;
}
