import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Metadata, status } from '@grpc/grpc-js';
import { ServiceError } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toComputeError } from '../../api/envelope.ts';
import { ComputeClientError, ComputeConnectionError, createComputeClient } from '../../client/index.ts';
import { parseConfig } from '../../core/config.ts';
import { asUnavailable } from '../../core/dependency-unavailable.ts';
import { freePort } from '../../db/local-postgres.ts';
import { createDb } from '../../db/pool.ts';
import { ComputeError } from '../../domain/errors.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { runCli } from '../cli/run-cli.ts';
import { callApi } from '../support/api.ts';
import { testLogger } from '../support/logger.ts';

function pgError(code: string): Error {
  return Object.assign(new Error(`pg error ${code}`), { code, severity: 'FATAL' });
}

function grpcError(code: number): Error {
  return Object.assign(new Error(`grpc ${code}`), { code, details: '', metadata: new Metadata() });
}

describe('a dependency out of reach is UNAVAILABLE', () => {
  test.each([
    ['ECONNREFUSED', pgError('ECONNREFUSED')],
    ['ECONNRESET', pgError('ECONNRESET')],
    ['57P01 admin_shutdown', pgError('57P01')],
    ['57P02 crash_shutdown', pgError('57P02')],
    ['57P03 cannot_connect_now', pgError('57P03')],
    ['08006 connection_failure', pgError('08006')],
    ['08000 connection_exception', pgError('08000')],
    ["pg's code-less 'Connection terminated unexpectedly'", new Error('Connection terminated unexpectedly')],
    ['a socket error as the cause', new Error('query failed', { cause: pgError('ECONNREFUSED') })],
    ['an AggregateError of connection attempts', new AggregateError([pgError('ECONNREFUSED')], 'connect')],
  ])('the database: %s', (_, error) => {
    const mapped = asUnavailable(error);
    expect(mapped).toBeInstanceOf(ComputeError);
    expect(mapped).toMatchObject({
      code: 'UNAVAILABLE',
      details: { dependency: 'database', retryAfterSeconds: 1 },
    });
  });

  test.each([
    ['UNAVAILABLE', status.UNAVAILABLE],
    ['DEADLINE_EXCEEDED', status.DEADLINE_EXCEEDED],
  ])('Temporal: a ServiceError caused by gRPC %s', (_, code) => {
    const error = new ServiceError('Failed to signalWithStart Workflow', { cause: grpcError(code) });
    expect(asUnavailable(error)).toMatchObject({ code: 'UNAVAILABLE', details: { dependency: 'temporal' } });
  });

  test('nothing else: SQL errors of the request, other gRPC statuses, messages that merely look alike', () => {
    for (const error of [
      pgError('23505'),
      pgError('40P01'),
      pgError('22P02'),
      new ServiceError('not found', { cause: grpcError(status.NOT_FOUND) }),
      new Error('Connection terminated unexpectedly, said the user'),
      Object.assign(new Error('Connection terminated unexpectedly'), { code: '23505' }),
      new TypeError('x is undefined'),
      'a string',
      null,
    ]) {
      expect(asUnavailable(error)).toBeNull();
    }
  });

  test.each([
    ['40P01 deadlock_detected', '40P01'],
    ['40001 serialization_failure', '40001'],
  ])('a transaction rolled back for %s is UNAVAILABLE too: nothing of it was kept', (_, code) => {
    expect(toComputeError(pgError(code), testLogger('unavailable'))).toMatchObject({
      code: 'UNAVAILABLE',
      details: { dependency: 'database', conflict: true, retryAfterSeconds: 1 },
    });
  });

  test('the API answers 503 with Retry-After while its database is down, never INTERNAL', async () => {
    // A pool pointed at a port nobody listens on: every query is refused, as while PostgreSQL restarts.
    const { db, close } = createDb(`postgres://postgres@127.0.0.1:${await freePort()}/none`, { max: 2 });
    try {
      const log = testLogger('unavailable');
      const compute = createCompute({
        config: parseConfig({}),
        db,
        log,
        iam: createEmbeddedIam({ db, log }),
      });
      const response = await compute.app.request('/api/compute/system/whoami', {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-better-compute': '1',
          authorization: 'Bearer bct_anything',
        },
        body: '{}',
      });
      expect(response.status).toBe(503);
      expect(response.headers.get('retry-after')).toBe('1');
      expect(((await response.json()) as { error: unknown }).error).toMatchObject({
        code: 'UNAVAILABLE',
        details: { dependency: 'database', retryAfterSeconds: 1 },
      });
      const again = await callApi(compute.app, 'bct_anything', 'reservations/list', { tenantId: 'acme' });
      expect(again).toMatchObject({ status: 503, body: { error: { code: 'UNAVAILABLE' } } });
      // In process too: the same typed error.
      await expect(
        compute.api.reservations.list({ token: 'bct_anything' }, { tenantId: 'acme' }),
      ).rejects.toMatchObject({ code: 'UNAVAILABLE', details: { dependency: 'database' } });
    } finally {
      await close();
    }
  });
});

// A small HTTP server that answers like an API whose database is restarting: the first tries of a
// call are UNAVAILABLE, the next one succeeds; or it drops the connection without an answer.
let server: Server;
let baseURL: string;
const calls = new Map<string, number>();
let failFirst = 2;

beforeAll(async () => {
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const url = req.url ?? '';
      const n = (calls.get(url) ?? 0) + 1;
      calls.set(url, n);
      const json = (code: number, value: unknown, headers: Record<string, string> = {}) =>
        res.writeHead(code, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(value));
      if (url.startsWith('/api/compute/drop/')) {
        if (n <= failFirst) return req.socket.destroy(); // the answer is lost
        return json(200, { data: { tries: n } });
      }
      if (n <= failFirst) {
        return json(
          503,
          {
            error: {
              code: 'UNAVAILABLE',
              message: 'the database cannot be reached right now',
              details: { dependency: 'database', retryAfterSeconds: 0.1 },
              requestId: `req_${n}`,
            },
          },
          { 'retry-after': '1' },
        );
      }
      return json(200, { data: { tries: n, body: JSON.parse(body || '{}') } });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('the typed client retries what is safe to retry', () => {
  test('UNAVAILABLE: again with back-off, never sooner than the server asks, until it answers', async () => {
    failFirst = 2;
    const notices: Array<{ reason: string; delayMs: number }> = [];
    const client = createComputeClient({
      baseURL,
      token: 't',
      retry: { attempts: 5, baseDelayMs: 10, onRetry: (n) => notices.push(n) },
    });
    await expect(client.$call('system', 'whoami')).resolves.toMatchObject({ tries: 3 });
    expect(notices.map((n) => n.reason)).toEqual(['UNAVAILABLE', 'UNAVAILABLE']);
    // details.retryAfterSeconds (0.1 s) wins over the base delay of 10 ms
    for (const { delayMs } of notices) expect(delayMs).toBeGreaterThanOrEqual(100);
  });

  test('gives up after `attempts` tries with the last answer; without `retry` it never retries', async () => {
    failFirst = 10;
    const retrying = createComputeClient({
      baseURL,
      token: 't',
      retry: { attempts: 3, baseDelayMs: 1 },
    });
    const error = await retrying.$call('limited', 'give').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ComputeClientError);
    expect(error).toMatchObject({ code: 'UNAVAILABLE', status: 503, requestId: 'req_3' });
    const plain = createComputeClient({ baseURL, token: 't' });
    await expect(plain.$call('limited', 'never')).rejects.toMatchObject({
      code: 'UNAVAILABLE',
      requestId: 'req_1',
    });
  });

  test('a lost answer is retried only for an idempotent call: one with an idempotencyKey, or marked', async () => {
    failFirst = 1;
    const client = createComputeClient({
      baseURL,
      token: 't',
      retry: { attempts: 3, baseDelayMs: 1 },
    });
    await expect(client.$call('drop', 'create', { idempotencyKey: 'k-1' })).resolves.toEqual({ tries: 2 });
    await expect(client.$call('drop', 'release', {}, { idempotent: true })).resolves.toEqual({ tries: 2 });
    const unkeyed = await client.$call('drop', 'mint', {}).catch((e: unknown) => e);
    expect(unkeyed).toBeInstanceOf(ComputeConnectionError);
    expect(calls.get('/api/compute/drop/mint')).toBe(1);
  });

  test('a connection refused is retried for any call: the request never left', async () => {
    const port = await freePort();
    const notices: string[] = [];
    const client = createComputeClient({
      baseURL: `http://127.0.0.1:${port}`,
      token: 't',
      retry: { attempts: 3, baseDelayMs: 1, onRetry: (n) => notices.push(n.reason) },
    });
    await expect(client.system.whoami()).rejects.toBeInstanceOf(ComputeConnectionError);
    expect(notices).toEqual(['CONNECTION', 'CONNECTION']);
  });
});

describe('the CLI retries too', () => {
  test('an UNAVAILABLE answer is tried again, with one line saying so, then the command succeeds', async () => {
    failFirst = 1;
    calls.clear();
    const result = await runCli(['release', 'rsv_x', '--tenant', 'acme', '--json'], {
      BETTER_COMPUTE_URL: baseURL,
      BETTER_COMPUTE_TOKEN: 't',
    });
    expect(result.stderr).toMatch(
      /reservations\.release answered UNAVAILABLE; retrying in \d+\.\d s \(1\/5\)/,
    );
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({
      tries: 2,
      body: { tenantId: 'acme', reservationId: 'rsv_x' },
    });
  }, 60_000);
});
