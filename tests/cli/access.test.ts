import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { beforeAll, describe, expect, onTestFinished, test, vi } from 'vitest';
import { useTestApi } from '../support/api.ts';
import { json, runCli } from './run-cli.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let asRoot: Record<string, string>;
let asAcme: Record<string, string>;
beforeAll(async () => {
  asRoot = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.root.token };
  asAcme = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
});

describe('bad input never reaches the API and says what to fix', () => {
  test('usage, credential and connection failures have distinct exit statuses and one line', async () => {
    const [unknownFlag, missingOption, badDuration, noUrl, noToken, unreachable, badUrl] = await Promise.all([
      runCli(['tokens', 'list', '--colour', 'red'], asRoot),
      runCli(['policies', 'list'], asRoot),
      runCli(['tokens', 'create', '--identity', 'idn_x', '--expires-in', 'forever'], asRoot),
      runCli(['tokens', 'list'], { BETTER_COMPUTE_TOKEN: 'x' }),
      runCli(['tokens', 'list'], { BETTER_COMPUTE_URL: api.url }),
      runCli(['tokens', 'list', '--url', 'http://127.0.0.1:9', '--token', 'x']),
      runCli(['tokens', 'list', '--url', 'not a url', '--token', 'x']),
    ]);
    expect(unknownFlag.code).toBe(2);
    expect(unknownFlag.stderr).toMatch(/unknown option '--colour'/);
    expect(missingOption.code).toBe(2);
    expect(missingOption.stderr).toMatch(/--tenant <tenant>' not specified/);
    expect(badDuration.code).toBe(2);
    expect(badDuration.stderr).toMatch(/'forever'/);
    expect(noUrl.code).toBe(2);
    expect(noUrl.stderr).toMatch(/no API URL: pass --url, set BETTER_COMPUTE_URL/);
    expect(noToken.code).toBe(5);
    expect(noToken.stderr).toMatch(/no API token: pass --token or set BETTER_COMPUTE_TOKEN/);
    expect(unreachable.code).toBe(4);
    expect(unreachable.stderr).toMatch(/cannot reach the API at http:\/\/127\.0\.0\.1:9/);
    expect(badUrl.code).toBe(2);
    for (const r of [unknownFlag, missingOption, badDuration, noUrl, noToken, unreachable, badUrl]) {
      expect(r.stderr).not.toMatch(/\n\s+at /); // never a stack trace
    }
  });

  test('a refused or unauthenticated call names the code, the reason and the next step', async () => {
    const [wrongToken, denied, deniedJson] = await Promise.all([
      runCli(['tokens', 'list', '--token', 'bct_nope'], asRoot),
      runCli(['tokens', 'list'], asAcme),
      runCli(['tokens', 'list', '--json'], asAcme),
    ]);
    expect(wrongToken.code).toBe(5);
    expect(wrongToken.stderr).toMatch(/^better-compute: UNAUTHENTICATED: .*Next: pass a valid token/);
    expect(denied.code).toBe(3);
    expect(denied.stderr).toMatch(/^better-compute: ACCESS_DENIED: .*Next: .*\[request req_/);
    expect(denied.stderr.trim().split('\n')).toHaveLength(1);
    expect(deniedJson.code).toBe(3);
    expect(JSON.parse(deniedJson.stdout).error).toMatchObject({ code: 'ACCESS_DENIED' });
  });
});

describe('tokens, policies and confirmations', () => {
  test('tokens create, list and revoke', async () => {
    const created = json(
      await runCli(['tokens', 'create', '--identity', api.acme.identityId, '--name', 'ci', '--json'], asRoot),
    );
    expect(created.token).toMatch(/^bct_/);
    const people = await runCli(
      ['tokens', 'create', '--identity', api.acme.identityId, '--expires-in', '30d'],
      asRoot,
    );
    expect(people.code).toBe(0);
    expect(people.stdout).toMatch(/This secret is shown once/);
    // The new token works.
    const whoCanList = await runCli(['events', 'list', '--json'], {
      BETTER_COMPUTE_URL: api.url,
      BETTER_COMPUTE_TOKEN: created.token,
    });
    expect(whoCanList.code).toBe(0);

    const listed = json(await runCli(['tokens', 'list', '--tenant', 'acme', '--json'], asRoot));
    expect(listed.tokens.map((t: { id: string }) => t.id)).toContain(created.id);
    const table = await runCli(['tokens', 'list', '--identity', api.acme.identityId], asRoot);
    expect(table.stdout.split('\n')[0]).toMatch(
      /^ID\s+IDENTITY\s+NAME\s+CREATED\s+LAST USED\s+EXPIRES\s+REVOKED$/,
    );

    const revoked = await runCli(['tokens', 'revoke', created.id], asRoot);
    expect(revoked.code).toBe(0);
    expect(revoked.stdout).toMatch(new RegExp(`revoked ${created.id}`));
    const missing = await runCli(['tokens', 'revoke', 'tok_missing'], asRoot);
    expect(missing.code).toBe(3);
    expect(missing.stderr).toMatch(/NOT_FOUND/);
  });

  test('policies apply FILE and list', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'bc-policies-'));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const file = path.join(dir, 'cap.json');
    writeFileSync(
      file,
      JSON.stringify({
        description: 'at most 8 GPUs',
        statements: [
          {
            effect: 'deny',
            actions: ['compute:reservations:create'],
            condition: { attribute: 'gpuCount', operator: 'greaterThan', value: 8 },
          },
        ],
      }),
    );
    const applied = await runCli(
      ['policies', 'apply', file, '--tenant', 'acme', '--name', 'gpu-cap'],
      asRoot,
    );
    expect(applied.stderr).toBe('');
    expect(applied.stdout.trim()).toBe('applied gpu-cap v1 to tenant acme');
    const again = json(
      await runCli(['policies', 'apply', file, '--tenant', 'acme', '--name', 'gpu-cap', '--json'], asRoot),
    );
    expect(again.version).toBe(2);
    const listed = await runCli(['policies', 'list', '--tenant', 'acme'], asRoot);
    expect(listed.stdout).toMatch(/gpu-cap\s+2\s+1/);

    const missingFile = await runCli(
      ['policies', 'apply', '/nonexistent/p.json', '--tenant', 'acme'],
      asRoot,
    );
    expect(missingFile.code).toBe(2);
    expect(missingFile.stderr).toMatch(/cannot read the policy \/nonexistent\/p\.json: no such file/);
    const badDoc = path.join(dir, 'bad.json');
    writeFileSync(badDoc, JSON.stringify({ statements: [{ effect: 'maybe', actions: ['compute:*'] }] }));
    const invalid = await runCli(['policies', 'apply', badDoc, '--tenant', 'acme'], asRoot);
    expect(invalid.code).toBe(2);
    expect(invalid.stderr).toMatch(/INVALID_INPUT/);
  });

  test('confirmations list, approve and deny', async () => {
    const listed = await runCli(['confirmations', 'list'], asAcme);
    expect(listed.code).toBe(0);
    expect(listed.stdout.trim()).toBe('no confirmations');
    const unknown = await runCli(['confirmations', 'approve', 'cnf_missing'], asAcme);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toMatch(/NOT_FOUND/);
  });
});
