import { z } from 'zod';
import { defineMethod } from './method.ts';

const whoami = defineMethod({
  summary: 'Who the credential belongs to: identity, tenant, kind and whether it administers the platform.',
  action: null,
  input: z.strictObject({}),
  output: z.object({
    identityId: z.string(),
    tenantId: z.string(),
    kind: z.enum(['person', 'service', 'agent']),
    sessionKind: z.enum(['direct', 'delegated']),
    rootAdmin: z.boolean(),
  }),
  handler: async ({ principal }) => ({
    identityId: principal.identityId,
    tenantId: principal.tenantId,
    kind: principal.kind,
    sessionKind: principal.sessionKind,
    rootAdmin: principal.rootAdmin,
  }),
});

export const systemMethods = { whoami };
