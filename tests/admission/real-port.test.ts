import { afterAll, beforeAll, expect, it } from 'vitest';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { type HttpServer, listen } from '../../server/http.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

const h = useAdmissionHarness();
let server: HttpServer;
let acme: TenantFixture;
let poolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  poolId = (await h100Pool(h, { nodes: 4, tenants: ['acme'], gpuQuota: 64 })).poolId;
  server = await listen(h.compute.app, '127.0.0.1', 0);
});

afterAll(async () => {
  await server?.stop();
});

interface Envelope {
  data: { id: string; state: string; [field: string]: unknown };
  error?: { code: string; message: string; requestId: string };
}

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  const response = await fetch(`${server.url}/api/compute/${path}`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${acme.token}`,
      'content-type': 'application/json',
      'x-better-compute': '1',
      ...headers,
    },
    body: JSON.stringify(body),
  });
  return {
    status: response.status,
    requestId: response.headers.get('x-request-id'),
    body: (await response.json()) as Envelope,
  };
}

it('serves the reservations API over a real port: 16 concurrent creates fill 4 nodes exactly', async () => {
  const answers = await Promise.all(
    Array.from({ length: 16 }, (_, i) =>
      post('reservations/create', {
        tenantId: 'acme',
        poolId,
        devices: [{ class: 'gpu', count: 4, topology: 'nvlink-all' }],
        duration: '1h',
        idempotencyKey: `port-${i}`,
      }),
    ),
  );
  const states = answers.map((a) => a.body.data?.state);
  expect(states.filter((s) => s === 'placed')).toHaveLength(8);
  expect(states.filter((s) => s === 'pending')).toHaveLength(8);
  expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  const placed = answers.find((a) => a.body.data.state === 'placed')!;
  const got = await post('reservations/get', { tenantId: 'acme', reservationId: placed.body.data.id });
  expect(got.body.data.id).toBe(placed.body.data.id);
  const bad = await post('reservations/get', { tenantId: 'acme' }, { 'x-request-id': 'req_mine' });
  expect(bad).toMatchObject({
    status: 400,
    requestId: 'req_mine',
    body: { error: { code: 'INVALID_INPUT', requestId: 'req_mine' } },
  });
  expect(bad.body.error?.message).toContain('reservationId');
});
