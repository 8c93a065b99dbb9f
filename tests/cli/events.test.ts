import { spawn } from 'node:child_process';
import path from 'node:path';
import { beforeAll, describe, expect, test, vi } from 'vitest';
import { newId } from '../../domain/ids.ts';
import { useTestApi } from '../support/api.ts';
import { insertOutboxEvent, untilReadable } from '../support/events.ts';
import { tenantMember } from '../support/iam.ts';
import { json, runCli } from './run-cli.ts';

// Each test spawns the real CLI several times; on a loaded machine one spawn takes seconds.
vi.setConfig({ testTimeout: 300_000 });

const api = useTestApi();
let asAcme: Record<string, string>;
let asAcmeAdmin: Record<string, string>;
beforeAll(async () => {
  asAcme = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: api.acme.token };
  const { token } = await tenantMember(api.iam, 'acme', { kind: 'service', name: 'acme-ops', role: 'admin' });
  asAcmeAdmin = { BETTER_COMPUTE_URL: api.url, BETTER_COMPUTE_TOKEN: token };
});

async function emit(type: string, subject: string, tenantId = 'acme') {
  return insertOutboxEvent(api.database.db, { type, subject, tenantId, data: { state: type.split('.')[1] } });
}

describe('events and webhooks from the CLI', () => {
  test('events list pages by subject and type; events watch prints one JSON object per line', async () => {
    const subject = `reservation/${newId('rsv')}`;
    await untilReadable(api.database.db, [
      await emit('reservation.placed', subject),
      await emit('reservation.active', subject),
      await emit('reservation.placed', `reservation/${newId('rsv')}`, 'globex'),
    ]);
    const [table, onlyActive, paged, bad] = await Promise.all([
      runCli(['events', 'list', '--subject', subject], asAcme),
      runCli(['events', 'list', '--subject', subject, '--type', 'reservation.active', '--json'], asAcme),
      runCli(['events', 'list', '--limit', '1', '--json'], asAcme),
      runCli(['events', 'list', '--type', 'Not A Type'], asAcme),
    ]);
    expect(table.stdout.split('\n')[0]).toMatch(/^\s*SEQ\s+TIME\s+TYPE\s+SUBJECT$/);
    expect(table.stdout).toMatch(/reservation\.placed\s+reservation\/rsv_/);
    expect(json(onlyActive).items.map((e: { type: string }) => e.type)).toEqual(['reservation.active']);
    expect(json(paged).next).toEqual(expect.any(Number));
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/INVALID_INPUT: types\[0\]/);

    const child = spawn(
      process.execPath,
      [
        path.resolve(import.meta.dirname, '../../bin/better-compute.js'),
        'events',
        'watch',
        '--subject',
        subject,
        '--json',
      ],
      { env: { PATH: process.env.PATH, ...asAcme, BETTER_COMPUTE_DATA_DIR: '/nonexistent' } },
    );
    let stdout = '';
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    // Give the CLI time to start and open the stream, then write while it watches.
    const deadline = Date.now() + 60_000;
    while (!stdout.includes('reservation.released') && Date.now() < deadline) {
      await emit('reservation.released', subject);
      await new Promise((r) => setTimeout(r, 1500));
    }
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    const line = JSON.parse(stdout.trim().split('\n')[0]!);
    expect(line).toMatchObject({ type: 'reservation.released', subject, tenantId: 'acme' });
  });

  test('webhooks create, list, deliveries and delete; a member is refused', async () => {
    const created = json(
      await runCli(
        [
          'webhooks',
          'create',
          '--tenant',
          'acme',
          '--endpoint',
          'https://hooks.example.com/bc',
          '--type',
          'reservation.*',
          '--json',
        ],
        asAcmeAdmin,
      ),
    );
    expect(created.secret).toMatch(/^whsec_/);
    const [listed, deliveries, denied, badUrl] = await Promise.all([
      runCli(['webhooks', 'list', '--tenant', 'acme'], asAcmeAdmin),
      runCli(['webhooks', 'deliveries', created.id, '--tenant', 'acme'], asAcmeAdmin),
      runCli(['webhooks', 'create', '--tenant', 'acme', '--endpoint', 'https://x.example.com'], asAcme),
      runCli(['webhooks', 'create', '--tenant', 'acme', '--endpoint', 'not-a-url'], asAcmeAdmin),
    ]);
    expect(listed.stdout).toMatch(
      new RegExp(`${created.id}\\s+https://hooks\\.example\\.com/bc\\s+reservation\\.\\*`),
    );
    expect(deliveries.stdout.trim()).toBe('no deliveries yet');
    expect(denied.code).toBe(3);
    expect(denied.stderr).toMatch(/ACCESS_DENIED/);
    expect(badUrl.code).toBe(2);
    const deleted = await runCli(['webhooks', 'delete', created.id, '--tenant', 'acme'], asAcmeAdmin);
    expect(deleted.stdout.trim()).toBe(`deleted ${created.id}`);
  });
});
