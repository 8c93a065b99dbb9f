import { request as httpRequest } from 'node:http';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../api/app.ts';
import type { Authenticator } from '../../api/authenticate.ts';
import { withFailedLookupCache } from '../../api/authenticate-cache.ts';
import { TokenBuckets } from '../../api/rate-limit.ts';
import { methods } from '../../api/registry.ts';
import { maxRequestBodyBytes } from '../../api/request-body.ts';
import { createComputeClient } from '../../client/index.ts';
import { parseConfig } from '../../core/config.ts';
import type { Principal } from '../../core/iam-port.ts';
import { ComputeError, errorCodes, errorCodeTraits } from '../../domain/errors.ts';
import { createCompute } from '../../server/compute.ts';
import { type HttpServer, listen } from '../../server/http.ts';
import { type ApiFixture, createApiFixture } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';

let h: ApiFixture;
let acme: TenantMember;
let acmeSecond: TenantMember;
let globex: TenantMember;
let poolId: string;

beforeAll(async () => {
  h = await createApiFixture();
  acme = await tenantMember(h.iam, 'acme');
  acmeSecond = await tenantMember(h.iam, 'acme', { name: 'acme-second' });
  globex = await tenantMember(h.iam, 'globex');
  poolId = (await seedPool(h.database.db, { nodes: 1, offers: { acme: { gpu: 8 } } })).poolId;
});

afterAll(async () => {
  await h?.stop();
});

const jsonHeaders = { 'content-type': 'application/json', 'x-better-compute': '1' };

function createBody(key: string, extra: Record<string, unknown> = {}) {
  return {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
    idempotencyKey: key,
    ...extra,
  };
}

/** One raw request through the app in process. */
async function raw(
  path: string,
  init: { method?: string; headers?: Record<string, string>; body?: string | ReadableStream } = {},
  app = h.compute.app,
) {
  const response = await app.request(path, {
    method: init.method ?? 'POST',
    headers: init.headers ?? { ...jsonHeaders, authorization: `Bearer ${acme.token}` },
    ...(init.body !== undefined ? { body: init.body } : {}),
    ...(init.body instanceof ReadableStream ? { duplex: 'half' } : {}),
  } as RequestInit);
  const text = await response.text();
  return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : undefined };
}

describe('the method lookup', () => {
  it('never walks the prototype chain: constructor, __proto__ and friends are NOT_FOUND', async () => {
    for (const name of ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf']) {
      const res = await h.call(acme.token, `system/${name}`, {});
      expect({ name, status: res.status, code: res.body.error?.code }).toEqual({
        name,
        status: 404,
        code: 'NOT_FOUND',
      });
      expect(res.body.error.message).toContain('system has whoami');
    }
    for (const group of ['constructor', '__proto__', 'toString']) {
      const res = await h.call(acme.token, `${group}/whoami`, {});
      expect(res.status).toBe(404);
      expect(res.body.error.message).toContain('the groups are system,');
    }
  });
});

describe('wrong HTTP methods', () => {
  it('answer 405 with Allow: POST and the typed envelope on every method route', async () => {
    for (const method of ['GET', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) {
      const res = await raw('/api/compute/reservations/create', { method });
      expect({ method, status: res.status, allow: res.headers.get('allow') }).toEqual({
        method,
        status: 405,
        allow: 'POST',
      });
      expect(res.body.error).toMatchObject({ code: 'INVALID_INPUT', details: { allow: ['POST'] } });
      expect(res.body.error.requestId).toBe(res.headers.get('x-request-id'));
    }
    const head = await raw('/api/compute/system/whoami', { method: 'HEAD' });
    expect({ status: head.status, allow: head.headers.get('allow'), body: head.body }).toEqual({
      status: 405,
      allow: 'POST',
      body: undefined,
    });
  });

  it('answer NOT_FOUND for a method that does not exist, whatever the HTTP method', async () => {
    const res = await raw('/api/compute/system/nothing', { method: 'GET' });
    expect(res).toMatchObject({ status: 404, body: { error: { code: 'NOT_FOUND' } } });
  });

  it('answer 405 with Allow: GET, HEAD on the event stream and the OpenAPI document', async () => {
    for (const path of ['/api/compute/events/stream', '/api/compute/openapi.json']) {
      const res = await raw(path, { method: 'POST', body: '{}' });
      expect({ path, status: res.status, allow: res.headers.get('allow') }).toEqual({
        path,
        status: 405,
        allow: 'GET, HEAD',
      });
      expect(res.body.error.code).toBe('INVALID_INPUT');
    }
  });

  it('answer TRACE with 405 over a real port too', async () => {
    const server: HttpServer = await listen(h.compute.app, '127.0.0.1', 0);
    try {
      const answer = await new Promise<{ status: number; allow: string | undefined; body: string }>(
        (resolve, reject) => {
          const req = httpRequest(
            `${server.url}/api/compute/system/whoami`,
            { method: 'TRACE', headers: { authorization: `Bearer ${acme.token}` } },
            (res) => {
              let body = '';
              res.setEncoding('utf8');
              res.on('data', (chunk) => {
                body += chunk;
              });
              res.on('end', () => resolve({ status: res.statusCode!, allow: res.headers.allow, body }));
            },
          );
          req.on('error', reject);
          req.end();
        },
      );
      expect(answer).toMatchObject({ status: 405, allow: 'POST' });
      expect(JSON.parse(answer.body).error.code).toBe('INVALID_INPUT');
    } finally {
      await server.stop();
    }
  });
});

describe('the error table', () => {
  it('answers UNSUPPORTED with 422, and only INTERNAL, CAPACITY_UNAVAILABLE and UNAVAILABLE with a 5xx', async () => {
    expect(errorCodeTraits.UNSUPPORTED.httpStatus).toBe(422);
    expect(errorCodes.filter((code) => errorCodeTraits[code].httpStatus >= 500)).toEqual([
      'CAPACITY_UNAVAILABLE',
      'UNAVAILABLE',
      'INTERNAL',
    ]);
    const res = await h.call(
      acme.token,
      'reservations/create',
      createBody('unsupported', { binding: 'instance' }),
    );
    expect(res).toMatchObject({ status: 422, body: { error: { code: 'UNSUPPORTED' } } });
  });
});

describe('the request body', () => {
  it('refuses a body over 1 MiB with INVALID_INPUT naming the limit, with or without a length', async () => {
    expect(maxRequestBodyBytes).toBe(1024 * 1024);
    const oversized = JSON.stringify({ idempotencyKey: 'x'.repeat(maxRequestBodyBytes) });
    // In process: a string body has no Content-Length, so the limit counts it as it streams.
    const streamed = await raw('/api/compute/system/whoami', {
      headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}` },
      body: oversized,
    });
    expect(streamed).toMatchObject({
      status: 400,
      body: { error: { code: 'INVALID_INPUT', details: { limitBytes: maxRequestBodyBytes } } },
    });
    expect(streamed.body.error.message).toContain('1 MiB');
    // Over a port, fetch sends Content-Length and the limit refuses before reading the body.
    const server = await listen(h.compute.app, '127.0.0.1', 0);
    try {
      const response = await fetch(`${server.url}/api/compute/system/whoami`, {
        method: 'POST',
        headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}` },
        body: oversized,
      });
      expect(response.status).toBe(400);
      expect(((await response.json()) as { error: { message: string } }).error.message).toContain('1 MiB');
    } finally {
      await server.stop();
    }
    // A body just under the limit is read and judged by the schema instead.
    const under = JSON.stringify({ colour: 'x'.repeat(maxRequestBodyBytes - 20) });
    const judged = await raw('/api/compute/system/whoami', {
      headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}` },
      body: under,
    });
    expect(judged.body.error).toMatchObject({ code: 'INVALID_INPUT' });
    expect(judged.body.error.message).toContain('colour');
  });

  it('refuses a non-JSON content type and unparsable JSON with INVALID_INPUT', async () => {
    for (const contentType of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data']) {
      const res = await raw('/api/compute/system/whoami', {
        headers: {
          'x-better-compute': '1',
          'content-type': contentType,
          authorization: `Bearer ${acme.token}`,
        },
        body: '{}',
      });
      expect({ contentType, code: res.body.error?.code }).toEqual({ contentType, code: 'INVALID_INPUT' });
      expect(res.body.error.message).toContain('application/json');
    }
    for (const contentType of ['application/json; charset=utf-8', 'application/vnd.api+json']) {
      const res = await raw('/api/compute/system/whoami', {
        headers: {
          'x-better-compute': '1',
          'content-type': contentType,
          authorization: `Bearer ${acme.token}`,
        },
        body: '{}',
      });
      expect({ contentType, status: res.status }).toEqual({ contentType, status: 200 });
    }
    for (const body of ['{', 'not json', '{"a":1,}', "{'a':1}", '[1,2']) {
      const res = await raw('/api/compute/system/whoami', { body });
      expect({ body, status: res.status, code: res.body.error?.code }).toEqual({
        body,
        status: 400,
        code: 'INVALID_INPUT',
      });
      expect(res.body.error.message).toContain('not valid JSON');
    }
  });
});

describe('strings and nesting', () => {
  it('refuses a NUL anywhere in the input before it reaches PostgreSQL, naming the path', async () => {
    const deny = await h.call(acme.token, 'confirmations/deny', { confirmationId: 'cnf_\u0000' });
    expect(deny).toMatchObject({ status: 400, body: { error: { code: 'INVALID_INPUT' } } });
    expect(deny.body.error.message).toMatch(/^confirmationId: contains a NUL/);
    const bind = await h.call(h.root.token, 'admin/bindRole', { identityId: 'idn\u0000x', role: 'member' });
    expect(bind.body.error).toMatchObject({
      code: 'INVALID_INPUT',
      details: { issues: [{ field: 'identityId' }] },
    });
    const nested = await h.call(
      acme.token,
      'reservations/create',
      createBody('nul-nested', {
        devices: [{ class: 'gpu', count: 1, selector: { nodeLabels: { zone: 'a\u0000' } } }],
      }),
    );
    expect(nested.body.error.message).toMatch(/^devices\[0\]\.selector\.nodeLabels\.zone: contains a NUL/);
    const key = await h.call(acme.token, 'reservations/create', createBody('nul-key', { 'a\u0000': 1 }));
    expect(key.body.error.code).toBe('INVALID_INPUT');
    expect(key.body.error.message).toContain('a key contains a NUL');
    const inProcess = await h.compute.api.confirmations
      .deny({ token: acme.token }, { confirmationId: '\u0000' })
      .catch((error: unknown) => error);
    expect(inProcess).toBeInstanceOf(ComputeError);
    expect((inProcess as ComputeError).code).toBe('INVALID_INPUT');
  });

  it('refuses lone surrogates, keeps every other unicode string', async () => {
    const lone = await h.call(acme.token, 'confirmations/deny', { confirmationId: 'cnf_\ud800' });
    expect(lone.body.error.message).toMatch(/^confirmationId: contains a lone UTF-16 surrogate/);
    // A lone surrogate escaped in the JSON text itself.
    const escaped = await raw('/api/compute/confirmations/deny', { body: '{"confirmationId":"\\udc00x"}' });
    expect(escaped.body.error.code).toBe('INVALID_INPUT');
    for (const text of ['\u202eevil', '👩‍👩‍👧‍👦', 'e\u0301', '\ufeff', 'ｆｕｌｌ', '\u2028']) {
      const res = await h.call(acme.token, 'confirmations/deny', { confirmationId: `cnf_${text}` });
      expect({ text, code: res.body.error?.code }).toEqual({ text, code: 'NOT_FOUND' });
    }
  });

  it('refuses nesting deeper than 32 levels', async () => {
    let deep: unknown = 1;
    for (let i = 0; i < 40; i++) deep = { a: deep };
    const res = await h.call(acme.token, 'system/whoami', { a: deep });
    expect(res.body.error.code).toBe('INVALID_INPUT');
    expect(res.body.error.message).toContain('nests deeper than 32 levels');
    // JSON.parse builds this without recursion; the check refuses it before anything walks it.
    const arrays = await h.call(acme.token, 'system/whoami', `${'['.repeat(100_000)}${']'.repeat(100_000)}`);
    expect(arrays.body.error.message).toContain('nests deeper than 32 levels');
    let shallow: unknown = 1;
    for (let i = 0; i < 30; i++) shallow = { a: shallow };
    const ok = await h.call(acme.token, 'system/whoami', { a: shallow });
    expect(ok.body.error.message).toContain('unknown field a');
  });
});

describe('x-request-id', () => {
  it('keeps a well-formed client id and replaces a malformed one with a fresh id', async () => {
    const kept = await raw('/api/compute/system/whoami', {
      headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}`, 'x-request-id': 'trace:01.a_b-c' },
      body: '{}',
    });
    expect(kept.headers.get('x-request-id')).toBe('trace:01.a_b-c');
    for (const bad of ['x'.repeat(129), 'has space', 'quote"', 'naïve', '<script>', 'a;b']) {
      const res = await raw('/api/compute/system/nothing', {
        headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}`, 'x-request-id': bad },
        body: '{}',
      });
      expect(res.headers.get('x-request-id')).toMatch(/^req_[0-9a-z]{26}$/);
      expect(res.body.error.requestId).toBe(res.headers.get('x-request-id'));
    }
  });

  it('writes only a validated id to audit rows', async () => {
    const bad = 'evil\tid'.repeat(30);
    const created = await raw('/api/compute/reservations/create', {
      headers: { ...jsonHeaders, authorization: `Bearer ${acme.token}`, 'x-request-id': bad },
      body: JSON.stringify(createBody('request-id-audit')),
    });
    expect(created.status).toBe(200);
    const fresh = created.headers.get('x-request-id')!;
    const { rows } = await sql<{ request_id: string | null }>`
      SELECT request_id FROM audit_events WHERE resource_id = ${created.body.data.id}`.execute(h.database.db);
    expect(rows.length).toBeGreaterThan(0);
    expect(new Set(rows.map((r) => r.request_id))).toEqual(new Set([fresh]));
  });
});

describe('record fields', () => {
  it('caps selector.attributes and nodeLabels at 32 keys and states it in the OpenAPI document', async () => {
    const attributes = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, i]));
    const res = await h.call(
      acme.token,
      'reservations/create',
      createBody('many-attributes', { devices: [{ class: 'gpu', count: 1, selector: { attributes } }] }),
    );
    expect(res.body.error.code).toBe('INVALID_INPUT');
    expect(res.body.error.message).toBe('devices[0].selector.attributes: at most 32 keys');
    const document = (await raw('/api/compute/openapi.json', { method: 'GET' })).body;
    const text = JSON.stringify(document.components.schemas.ReservationsCreateInput);
    expect(text).toContain('"maxProperties":32');
    const labels = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`l${i}`, 'v']));
    const tooManyLabels = await h.call(acme.token, 'capacity/preview', {
      ...createBody('x', { devices: [{ class: 'gpu', count: 1, selector: { nodeLabels: labels } }] }),
      idempotencyKey: undefined,
    });
    expect(tooManyLabels.body.error.message).toContain('at most 32 keys');
  });
});

describe('rate limits', () => {
  it('answers RATE_LIMITED with retryAfterSeconds and Retry-After per token, then per tenant', async () => {
    const app = createApiApp(h.deps, methods, {
      rateLimits: { perToken: { perSecond: 0.5, burst: 3 }, perTenant: { perSecond: 0.5, burst: 5 } },
    });
    const whoami = (token: string) =>
      raw(
        '/api/compute/system/whoami',
        { headers: { ...jsonHeaders, authorization: `Bearer ${token}` }, body: '{}' },
        app,
      );
    for (let i = 0; i < 3; i++) expect((await whoami(acme.token)).status).toBe(200);
    const limited = await whoami(acme.token);
    expect(limited).toMatchObject({
      status: 429,
      body: { error: { code: 'RATE_LIMITED', details: { scope: 'token', retryAfterSeconds: 2 } } },
    });
    expect(limited.headers.get('retry-after')).toBe('2');
    // Another token of the same tenant has its own bucket, up to the tenant's.
    expect((await whoami(acmeSecond.token)).status).toBe(200);
    expect((await whoami(acmeSecond.token)).status).toBe(200);
    const tenantLimited = await whoami(acmeSecond.token);
    expect(tenantLimited.body.error).toMatchObject({ code: 'RATE_LIMITED', details: { scope: 'tenant' } });
    expect(Number(tenantLimited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    // Another tenant is not affected.
    expect((await whoami(globex.token)).status).toBe(200);
  });

  it('lets the typed client retry once after the time the server asks', async () => {
    const app = createApiApp(h.deps, methods, {
      rateLimits: { perToken: { perSecond: 2, burst: 1 }, perTenant: { perSecond: 0, burst: 1 } },
    });
    const client = createComputeClient<ReturnType<typeof createCompute>>({
      baseURL: 'http://in-process',
      token: globex.token,
      retryOnRateLimit: true,
      fetch: async (input, init) => app.fetch(new Request(input, init)),
    });
    await client.system.whoami({});
    const started = performance.now();
    await expect(client.system.whoami({})).resolves.toMatchObject({ tenantId: 'globex' });
    expect(performance.now() - started).toBeGreaterThanOrEqual(900);
    const impatient = createComputeClient<ReturnType<typeof createCompute>>({
      baseURL: 'http://in-process',
      token: globex.token,
      fetch: async (input, init) => app.fetch(new Request(input, init)),
    });
    await expect(impatient.system.whoami({})).rejects.toMatchObject({
      code: 'RATE_LIMITED',
      status: 429,
      details: { retryAfterSeconds: 1 },
    });
  });

  it('reads its limits from the configuration; the defaults leave room for the test suite', () => {
    expect(parseConfig({})).toMatchObject({
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: 50,
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN_BURST: 200,
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: 200,
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT_BURST: 1000,
    });
    expect(
      parseConfig({
        BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
        BETTER_COMPUTE_RATE_LIMIT_PER_TENANT_BURST: '5',
      }),
    ).toMatchObject({
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: 0,
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT_BURST: 5,
    });
    expect(() => parseConfig({ BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '-1' })).toThrow(
      /BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN/,
    );
  });

  it('refills a token bucket with elapsed time and forgets idle full buckets first', () => {
    const buckets = new TokenBuckets({ perSecond: 10, burst: 2 }, 2);
    buckets.take('a', 0);
    buckets.take('a', 0);
    expect(buckets.waitSeconds('a', 0)).toBeCloseTo(0.1);
    expect(buckets.waitSeconds('a', 100)).toBe(0);
    buckets.take('b', 1000);
    buckets.take('c', 1000); // 'a' is full again by now: it goes first
    buckets.take('c', 1000);
    expect(buckets.waitSeconds('b', 1000)).toBe(0);
    expect(buckets.waitSeconds('c', 1000)).toBeCloseTo(0.1);
  });
});

describe('failed token look-ups', () => {
  it('asks IAM once for a flood of one bad token, and again for every good one', async () => {
    let lookups = 0;
    const counted = {
      ...h.deps.iam,
      authenticate: (credential: { token: string }) => {
        lookups++;
        return h.deps.iam.authenticate(credential);
      },
    };
    const compute = createCompute({ ...h.deps, iam: counted });
    const call = (token: string) =>
      raw(
        '/api/compute/system/whoami',
        { headers: { ...jsonHeaders, authorization: `Bearer ${token}` }, body: '{}' },
        compute.app,
      );
    for (let i = 0; i < 20; i++) {
      const res = await call('bct_not-a-real-token');
      expect(res).toMatchObject({ status: 401, body: { error: { code: 'UNAUTHENTICATED' } } });
    }
    expect(lookups).toBe(1);
    await call('bct_another-bad-one');
    expect(lookups).toBe(2);
    expect((await call(acme.token)).status).toBe(200);
    expect(lookups).toBe(3);
  });

  it('remembers only UNAUTHENTICATED, never a failure of the lookup itself', async () => {
    let calls = 0;
    const failing: Authenticator = async () => {
      calls++;
      throw new ComputeError('INTERNAL', 'database down');
    };
    const cached = withFailedLookupCache(failing, { ttlMs: 60_000 });
    await expect(cached('t')).rejects.toMatchObject({ code: 'INTERNAL' });
    await expect(cached('t')).rejects.toMatchObject({ code: 'INTERNAL' });
    expect(calls).toBe(2);
    const principal = { identityId: 'i', tenantId: 't', kind: 'person', tokenId: 'k' } as Principal;
    let refusals = 0;
    const flaky: Authenticator = async (token) => {
      if (token === 'bad') {
        refusals++;
        throw new ComputeError('UNAUTHENTICATED', 'unknown');
      }
      return principal;
    };
    let now = 0;
    const expiring = withFailedLookupCache(flaky, { ttlMs: 1000, now: () => now });
    await expect(expiring('bad')).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    now = 999;
    await expect(expiring('bad')).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    expect(refusals).toBe(1);
    now = 1000;
    await expect(expiring('bad')).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    expect(refusals).toBe(2);
    await expect(expiring('good')).resolves.toBe(principal);
    await expect(expiring(undefined)).resolves.toBe(principal);
  });
});
