import { describe, expectTypeOf, test } from 'vitest';
import { z } from 'zod';
import { defineMethod } from '../../api/method.ts';
import type { Methods } from '../../api/registry.ts';
import {
  type ComputeClient,
  type ComputeClientError,
  createComputeClient,
  type MethodInput,
  type MethodOutput,
} from '../../client/index.ts';
import type { ErrorCode } from '../../domain/errors.ts';
import type { Compute } from '../../server/compute.ts';

// A registry shaped like the server's, to pin the inference rules down independently of which
// groups exist today.
const sample = {
  things: {
    create: defineMethod({
      summary: 'create',
      action: null,
      input: z.strictObject({
        name: z.string(),
        count: z.number().int().default(1),
        duration: z.union([z.string(), z.number()]).transform((v) => Number(v)),
      }),
      output: z.object({ id: z.string(), state: z.enum(['placed', 'pending']), at: z.number() }),
      handler: async () => ({ id: 'x', state: 'placed' as const, at: 1 }),
    }),
    list: defineMethod({
      summary: 'list',
      action: null,
      input: z.strictObject({ limit: z.number().optional() }),
      output: z.object({ items: z.array(z.object({ id: z.string() })) }),
      handler: async () => ({ items: [] }),
    }),
  },
};

describe('createComputeClient', () => {
  const client = createComputeClient<typeof sample>({ baseURL: 'http://x', token: 't' });

  test('inputs are the schemas’ input types; outputs their output types', () => {
    expectTypeOf(client.things.create).parameter(0).toEqualTypeOf<{
      name: string;
      count?: number | undefined;
      duration: string | number;
    }>();
    expectTypeOf(client.things.create).returns.resolves.toEqualTypeOf<{
      id: string;
      state: 'placed' | 'pending';
      at: number;
    }>();
    expectTypeOf<MethodInput<typeof sample, 'things', 'list'>>().toEqualTypeOf<{
      limit?: number | undefined;
    }>();
    expectTypeOf<MethodOutput<typeof sample, 'things', 'list'>>().toEqualTypeOf<{
      items: { id: string }[];
    }>();
  });

  test('a wrong field, a wrong type or a missing field is a compile error', () => {
    // @ts-expect-error unknown field
    void client.things.create({ name: 'a', duration: '8h', colour: 'red' });
    // @ts-expect-error wrong type
    void client.things.create({ name: 1, duration: '8h' });
    // @ts-expect-error missing required field
    void client.things.create({ name: 'a' });
    // @ts-expect-error no input at all, but one is required
    void client.things.create();
    // @ts-expect-error no such method
    void client.things.remove({});
    // @ts-expect-error no such group
    void client.widgets;
    // A method whose input has no required field may be called without one.
    void client.things.list();
    void client.things.list({}, { signal: AbortSignal.timeout(1000) });
  });

  test('the client is typed from `typeof compute` or from the registry alike', () => {
    const fromCompute = createComputeClient<Compute>({ baseURL: 'http://x' });
    const fromRegistry = createComputeClient<Methods>({ baseURL: 'http://x' });
    const byDefault = createComputeClient({ baseURL: 'http://x', token: () => 't' });
    expectTypeOf(fromCompute).toEqualTypeOf<ComputeClient<Methods>>();
    expectTypeOf(fromRegistry.system.whoami).returns.resolves.toEqualTypeOf<{
      identityId: string;
      tenantId: string;
      kind: 'person' | 'service' | 'agent';
      sessionKind: 'direct' | 'delegated';
      rootAdmin: boolean;
    }>();
    expectTypeOf(byDefault.system.whoami).toEqualTypeOf(fromCompute.system.whoami);
    // @ts-expect-error whoami takes no fields
    void byDefault.system.whoami({ tenantId: 'acme' });
  });

  test('errors carry a typed code, details and requestId', () => {
    expectTypeOf<ComputeClientError['code']>().toEqualTypeOf<ErrorCode>();
    expectTypeOf<ComputeClientError['details']>().toEqualTypeOf<Record<string, unknown> | undefined>();
    expectTypeOf<ComputeClientError['requestId']>().toEqualTypeOf<string | undefined>();
    expectTypeOf<ComputeClientError['status']>().toEqualTypeOf<number>();
  });
});

describe('the real registry', () => {
  const client = createComputeClient<Compute>({ baseURL: 'http://x', token: 't' });

  test('reservations.create takes the seed’s request and answers the reservation object', () => {
    const created = client.reservations.create({
      tenantId: 'acme',
      poolId: 'pool_1',
      devices: [{ class: 'gpu', count: 4, topology: 'nvlink-all' }],
      duration: '8h',
      idempotencyKey: 'train-2026-09-24',
      wait: { timeoutMs: 20_000 },
    });
    expectTypeOf(created).resolves.toHaveProperty('state').toEqualTypeOf<string>();
    expectTypeOf(created)
      .resolves.toHaveProperty('operation')
      .toHaveProperty('state')
      .toEqualTypeOf<'running' | 'pending' | 'succeeded' | 'failed'>();
    void client.reservations.create({
      tenantId: 'acme',
      poolId: 'p',
      // @ts-expect-error an unknown field of a device request
      devices: [{ class: 'gpu', count: 1, colour: 'red' }],
      duration: '1h',
      idempotencyKey: 'k',
    });
    void client.reservations.create({
      tenantId: 'acme',
      poolId: 'p',
      // @ts-expect-error a device class that does not exist
      devices: [{ class: 'tpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'k',
    });
    // @ts-expect-error the idempotency key is required
    void client.reservations.create({
      tenantId: 'acme',
      poolId: 'p',
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
    });
    void client.reservations.extend({
      tenantId: 'acme',
      reservationId: 'r',
      // @ts-expect-error extend takes until or by, not a duration
      duration: '1h',
      idempotencyKey: 'k',
    });
  });

  test('events and webhooks are typed the same way', () => {
    expectTypeOf(client.events.list).returns.resolves.toHaveProperty('next').toEqualTypeOf<number | null>();
    // @ts-expect-error limit is a number
    void client.events.list({ limit: '10' });
    expectTypeOf(client.webhooks.create).returns.resolves.toHaveProperty('secret').toEqualTypeOf<string>();
  });
});
