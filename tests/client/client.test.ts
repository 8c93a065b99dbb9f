import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ComputeClientError, ComputeConnectionError, createComputeClient } from '../../client/index.ts';

// A small HTTP server speaking the API's envelope, to drive the client through answers the real
// API gives rarely (RATE_LIMITED, a hang, a proxy's error page).
let server: Server;
let baseURL: string;
const seen: Array<{ url: string; headers: IncomingHttpHeaders; body: string }> = [];
let rateLimitedCalls = 0;

beforeAll(async () => {
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ url: req.url ?? '', headers: req.headers, body });
      const json = (status: number, value: unknown, headers: Record<string, string> = {}) =>
        res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(value));
      switch (req.url) {
        case '/api/compute/system/whoami':
          return json(200, { data: { tenantId: 'acme' } });
        case '/api/compute/limited/once':
          if (++rateLimitedCalls % 2 === 1) {
            return json(429, {
              error: {
                code: 'RATE_LIMITED',
                message: 'slow down',
                details: { retryAfterSeconds: 0.2 },
                requestId: 'req_1',
              },
            });
          }
          return json(200, { data: { ok: true } });
        case '/api/compute/limited/always':
          return json(
            429,
            { error: { code: 'RATE_LIMITED', message: 'slow down', requestId: 'req_2' } },
            { 'retry-after': '0' },
          );
        case '/api/compute/proxy/page':
          return res.writeHead(502, { 'content-type': 'text/html' }).end('<html>Bad gateway</html>');
        case '/api/compute/slow/hang':
          return; // never answers
        default:
          return json(404, {
            error: {
              code: 'NOT_FOUND',
              message: 'no such method',
              details: { path: req.url },
              requestId: 'req_3',
            },
          });
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('the typed client at runtime', () => {
  test('sends the required header, the bearer token (from a function) and the request id', async () => {
    const client = createComputeClient({ baseURL, token: async () => 'bct_live' });
    await expect(client.system.whoami(undefined, { requestId: 'req_mine' })).resolves.toEqual({
      tenantId: 'acme',
    });
    const call = seen.at(-1)!;
    expect(call.headers['x-better-compute']).toBe('1');
    expect(call.headers.authorization).toBe('Bearer bct_live');
    expect(call.headers['x-request-id']).toBe('req_mine');
    expect(call.body).toBe('{}');
  });

  test('errors carry code, status, details and requestId', async () => {
    const client = createComputeClient({ baseURL, token: 't' }) as any;
    const error = await client.no.such({ a: 1 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ComputeClientError);
    expect(error).toMatchObject({ code: 'NOT_FOUND', status: 404, requestId: 'req_3', method: 'no.such' });
    expect(error.details).toEqual({ path: '/api/compute/no/such' });
  });

  test('retries once after RATE_LIMITED when asked to, waiting what the server said; never twice', async () => {
    const plain = createComputeClient({ baseURL, token: 't' }) as any;
    const refused = await plain.limited.once().catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: 'RATE_LIMITED', status: 429 });
    rateLimitedCalls = 0;

    const retrying = createComputeClient({ baseURL, token: 't', retryOnRateLimit: true }) as any;
    const started = Date.now();
    await expect(retrying.limited.once()).resolves.toEqual({ ok: true });
    expect(Date.now() - started).toBeGreaterThanOrEqual(190);
    expect(rateLimitedCalls).toBe(2);

    const before = seen.length;
    await expect(retrying.limited.always()).rejects.toMatchObject({
      code: 'RATE_LIMITED',
      requestId: 'req_2',
    });
    expect(seen.length - before).toBe(2);
  });

  test('an AbortSignal cancels a call in flight', async () => {
    const client = createComputeClient({ baseURL, token: 't' }) as any;
    const controller = new AbortController();
    const pending = client.slow.hang({}, { signal: controller.signal });
    setTimeout(() => controller.abort(new Error('user gave up')), 100);
    await expect(pending).rejects.toThrow('user gave up');
  });

  test('no answer, or an answer without the envelope, is a connection error', async () => {
    const client = createComputeClient({ baseURL, token: 't' }) as any;
    const page = await client.proxy.page().catch((e: unknown) => e);
    expect(page).toBeInstanceOf(ComputeConnectionError);
    expect(page.status).toBe(502);
    expect(page.message).toMatch(/without the Better Compute envelope/);
    const unreachable = createComputeClient({ baseURL: 'http://127.0.0.1:9', token: 't' });
    await expect(unreachable.system.whoami()).rejects.toBeInstanceOf(ComputeConnectionError);
  });
});
