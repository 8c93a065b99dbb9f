import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { clusterProcessKinds, commandArgv, deployDir, readProcfile } from '../../server/cluster-processes.ts';
import { ensureHaproxy } from '../../server/cluster-tools.ts';
import { temporalTls } from '../../temporal/client.ts';
import { defaultToolsDir } from '../../temporal/dev-server.ts';
import { searchAttributes } from '../../workflows/search-attributes.ts';
import { testLogger } from '../support/logger.ts';

/** What deploy/ holds agrees with the code: the cluster test runs these files, this checks their parts. */
describe('deploy/', () => {
  it('registers exactly the search attributes the workflows carry, all Keyword', () => {
    const script = readFileSync(path.join(deployDir, 'temporal', 'register-namespace.sh'), 'utf8');
    const names = /\nnames=\(([^)]*)\)/.exec(script)![1]!.split(/\s+/).filter(Boolean);
    expect(names.sort()).toEqual(
      Object.values(searchAttributes)
        .map((k) => k.name)
        .sort(),
    );
    expect(Object.values(searchAttributes).every((k) => k.type === 'KEYWORD')).toBe(true);
    // The CLI pairs the n-th --name with the n-th --type: one --type alone registers one name.
    expect(script).toMatch(/pairs\+=\(--name "\$name" --type Keyword\)/);
  });

  it('has a Procfile line for every kind of process, expanded from the environment', () => {
    const procfile = readProcfile();
    expect(Object.keys(procfile).sort()).toEqual([...clusterProcessKinds].sort());
    expect(commandArgv(procfile.api, {}).slice(-3)).toEqual(['serve', '--mode', 'api']);
    expect(() => commandArgv(procfile['temporal-history'], {})).toThrow(/needs TEMPORAL_SERVER/);
    expect(
      commandArgv(procfile['temporal-history'], { TEMPORAL_SERVER: '/x/server', BC_DEPLOY_DIR: '/d' }),
    ).toEqual([
      '/x/server',
      '--root',
      '/',
      '--config',
      '/d/temporal',
      '--env',
      'cluster',
      '--allow-no-auth',
      'start',
      '--service',
      'history',
    ]);
  });

  it("the load balancer's configuration is valid for the HAProxy the project fetches", () => {
    const haproxy = ensureHaproxy(
      process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      testLogger('deploy'),
    );
    const out = execFileSync(haproxy.binary, ['-c', '-f', path.join(deployDir, 'haproxy', 'haproxy.cfg')], {
      encoding: 'utf8',
      env: {
        LD_LIBRARY_PATH: haproxy.libraryPath,
        BC_LB_BIND: '127.0.0.1:1',
        BC_API_1: '127.0.0.1:2',
        BC_API_2: '127.0.0.1:3',
        BC_LB_ERRORS: path.join(deployDir, 'haproxy', 'errors'),
      },
    });
    expect(out).toMatch(/valid/);
    // What it answers when no API process can: the API's own typed, retryable envelope.
    const page = readFileSync(path.join(deployDir, 'haproxy', 'errors', '503.http'), 'utf8');
    const [head, body] = page.split('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.0 503 /);
    expect(head).toMatch(/Retry-After: 1/);
    expect(JSON.parse(body!).error.code).toBe('UNAVAILABLE');
  }, 120_000);

  it("reads TLS to Temporal from TEMPORAL_TLS and TEMPORAL_TLS_* (the CLI flags' names)", () => {
    expect(temporalTls(parseConfig({}))).toBeUndefined();
    expect(temporalTls(parseConfig({ TEMPORAL_TLS: 'true' }))).toEqual({});
    expect(
      temporalTls(parseConfig({ TEMPORAL_TLS: 'false', TEMPORAL_TLS_CA_PATH: '/nope' })),
    ).toBeUndefined();
    expect(() => temporalTls(parseConfig({ TEMPORAL_TLS_CA_PATH: '/nope/ca.pem' }))).toThrow(
      /TEMPORAL_TLS_CA_PATH \(\/nope\/ca.pem\) cannot be read/,
    );
    expect(() => temporalTls(parseConfig({ TEMPORAL_TLS_CERT_PATH: '/c.pem' }))).toThrow(/go together/);
    expect(() => parseConfig({ TEMPORAL_TLS: 'yes' })).toThrow(/TEMPORAL_TLS/);
  });
});
