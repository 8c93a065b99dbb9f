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
