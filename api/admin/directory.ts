import { z } from 'zod';
import { policyDocumentSchema } from '../../core/iam-policy.ts';
import { tenantIdPattern } from '../../core/iam-port.ts';
import { defineMethod } from '../method.ts';
import { iamAdmin, ms, requireRootAdmin } from './guard.ts';

const tenantId = z.string().regex(tenantIdPattern, "a tenant id: lower-case letters, digits, '-' or '_'");
const tenantOut = z.object({
  id: z.string(),
  name: z.string(),
  parentId: z.string().nullable(),
  createdAt: z.number(),
});
const identityKind = z.enum(['person', 'service', 'agent']);
const identityOut = z.object({
  id: z.string(),
  tenantId: z.string(),
  kind: identityKind,
  name: z.string(),
  email: z.string().nullable(),
  delegationId: z.string().nullable(),
  createdAt: z.number(),
});
const tokenOut = z.object({
  id: z.string(),
  identityId: z.string(),
  name: z.string(),
  expiresAt: z.number().nullable(),
  revokedAt: z.number().nullable(),
  lastUsedAt: z.number().nullable(),
  createdAt: z.number(),
});
const action = z
  .string()
  .regex(/^(\*|compute:(\*|[a-z-]+:(\*|[a-z-]+)))$/, 'an action such as compute:reservations:*');

const createTenant = defineMethod({
  summary: 'Create a tenant (an organization) below the root tenant or below `parentId`.',
  action: 'compute:admin:write',
  input: z.strictObject({
    id: tenantId.optional(),
    name: z.string().min(1).max(200),
    parentId: tenantId.optional(),
  }),
  output: tenantOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const t = await iamAdmin(ctx).createTenant(input);
    return { ...t, createdAt: t.createdAt.getTime() };
  },
});

const listTenants = defineMethod({
  summary: 'Every tenant of the platform.',
  action: 'compute:admin:read',
  input: z.strictObject({}),
  output: z.object({ tenants: z.array(tenantOut) }),
  handler: async (ctx) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const tenants = await iamAdmin(ctx).listTenants();
    return { tenants: tenants.map((t) => ({ ...t, createdAt: t.createdAt.getTime() })) };
  },
});

const createIdentity = defineMethod({
  summary:
    'Create a person, service account or agent; an agent with `personIdentityId` acts for that person, and `confirmActions` are held for the person to confirm.',
  action: 'compute:admin:write',
  input: z
    .strictObject({
      tenantId,
      kind: identityKind,
      name: z.string().min(1).max(200),
      email: z.string().max(320).email().optional(),
      personIdentityId: z.string().min(1).max(100).optional(),
      confirmActions: z.array(action).max(50).optional(),
      roles: z.array(z.string().min(1).max(100)).max(20).optional(),
    })
    .refine((v) => v.personIdentityId === undefined || v.kind === 'agent', {
      message: 'only an agent acts for a person',
      path: ['personIdentityId'],
    })
    // Stated in the JSON Schema too, so the OpenAPI document says what the server refuses.
    .meta({
      dependentSchemas: {
        personIdentityId: { required: ['kind'], properties: { kind: { const: 'agent' } } },
      },
    }),
  output: identityOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    // The roles are bound with the identity, all or nothing: an unknown role creates nothing.
    const identity = await iamAdmin(ctx).createIdentity(input);
    return { ...identity, createdAt: identity.createdAt.getTime() };
  },
});

const listIdentities = defineMethod({
  summary: "A tenant's identities.",
  action: 'compute:admin:read',
  input: z.strictObject({ tenantId }),
  output: z.object({ identities: z.array(identityOut) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const identities = await iamAdmin(ctx).listIdentities(input.tenantId);
    return { identities: identities.map((i) => ({ ...i, createdAt: i.createdAt.getTime() })) };
  },
});

const createToken = defineMethod({
  summary: 'Mint an API token for an identity. The secret is in this answer only; it is stored hashed.',
  action: 'compute:admin:write',
  input: z.strictObject({
    identityId: z.string().min(1).max(100),
    name: z.string().max(200).optional(),
    expiresInSeconds: z.number().int().min(60).max(31_536_000).optional(),
  }),
  output: tokenOut.extend({ token: z.string() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const t = await iamAdmin(ctx).createToken(input);
    return {
      ...t,
      expiresAt: ms(t.expiresAt),
      revokedAt: null,
      lastUsedAt: null,
      createdAt: t.createdAt.getTime(),
    };
  },
});

const listTokens = defineMethod({
  summary: 'Tokens of an identity or a tenant, without their secrets, with their last use.',
  action: 'compute:admin:read',
  input: z.strictObject({ identityId: z.string().min(1).max(100).optional(), tenantId: tenantId.optional() }),
  output: z.object({ tokens: z.array(tokenOut) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const tokens = await iamAdmin(ctx).listTokens(input);
    return {
      tokens: tokens.map((t) => ({
        ...t,
        expiresAt: ms(t.expiresAt),
        revokedAt: ms(t.revokedAt),
        lastUsedAt: ms(t.lastUsedAt),
        createdAt: t.createdAt.getTime(),
      })),
    };
  },
});

const revokeToken = defineMethod({
  summary: 'Revoke a token (idempotent); cached authentications lapse within 30 seconds.',
  action: 'compute:admin:write',
  input: z.strictObject({ tokenId: z.string().min(1).max(100) }),
  output: z.object({ id: z.string(), revokedAt: z.number() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const r = await iamAdmin(ctx).revokeToken(input.tokenId);
    return { id: r.id, revokedAt: r.revokedAt.getTime() };
  },
});

const revokeDelegation = defineMethod({
  summary:
    "Revoke an agent's delegation from its person (idempotent): the agent's tokens stop authenticating (UNAUTHENTICATED), and no new token can be minted for it.",
  action: 'compute:admin:write',
  input: z.strictObject({ delegationId: z.string().min(1).max(100) }),
  output: z.object({ id: z.string(), agentIdentityId: z.string(), revokedAt: z.number() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const r = await iamAdmin(ctx).revokeDelegation(input.delegationId);
    return { id: r.id, agentIdentityId: r.agentIdentityId, revokedAt: r.revokedAt.getTime() };
  },
});

const roleOut = z.object({
  id: z.string(),
  tenantId: z.string().nullable(),
  name: z.string(),
  actions: z.array(z.string()),
});

const createRole = defineMethod({
  summary: 'Create a role of a tenant granting `compute:*` actions.',
  action: 'compute:admin:write',
  input: z.strictObject({
    tenantId,
    name: z.string().min(1).max(100),
    actions: z.array(action).min(1).max(100),
  }),
  output: roleOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    return iamAdmin(ctx).createRole(input);
  },
});

const listRoles = defineMethod({
  summary: "The built-in roles and a tenant's own.",
  action: 'compute:admin:read',
  input: z.strictObject({ tenantId: tenantId.optional() }),
  output: z.object({ roles: z.array(roleOut) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return { roles: await iamAdmin(ctx).listRoles(input.tenantId) };
  },
});

const bindRole = defineMethod({
  summary: "Grant a role (by id or name) to an identity on a tenant (default: the identity's own).",
  action: 'compute:admin:write',
  input: z.strictObject({
    identityId: z.string().min(1).max(100),
    role: z.string().min(1).max(100),
    tenantId: tenantId.optional(),
  }),
  output: z.object({
    identityId: z.string(),
    roleId: z.string(),
    roleName: z.string(),
    tenantId: z.string(),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    return iamAdmin(ctx).bindRole(input);
  },
});

const policyOut = z.object({
  id: z.string(),
  tenantId: z.string(),
  name: z.string(),
  version: z.number(),
  document: policyDocumentSchema,
});

const applyPolicy = defineMethod({
  summary: 'Apply a policy document under a name; each apply is a new version, in force at once.',
  action: 'compute:admin:write',
  input: z.strictObject({ tenantId, name: z.string().min(1).max(100), document: policyDocumentSchema }),
  output: policyOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    return iamAdmin(ctx).applyPolicy({ ...input, createdBy: ctx.principal.identityId });
  },
});

const listPolicies = defineMethod({
  summary: "Every version of a tenant's policies, newest version first.",
  action: 'compute:admin:read',
  input: z.strictObject({ tenantId }),
  output: z.object({ policies: z.array(policyOut.extend({ createdAt: z.number() })) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const policies = await iamAdmin(ctx).listPolicies(input.tenantId);
    return { policies: policies.map((p) => ({ ...p, createdAt: p.createdAt.getTime() })) };
  },
});

const setBudget = defineMethod({
  summary: "Set a tenant's monthly budget for a meter (`*`: all meters); billingCheck answers from it.",
  action: 'compute:admin:write',
  input: z.strictObject({ tenantId, meter: z.string().min(1).max(100).optional(), limit: z.number().min(0) }),
  output: z.object({ tenantId: z.string(), meter: z.string(), limit: z.number() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    return iamAdmin(ctx).setBudget(input);
  },
});

export const adminDirectoryMethods = {
  createTenant,
  listTenants,
  createIdentity,
  listIdentities,
  createToken,
  listTokens,
  revokeToken,
  revokeDelegation,
  createRole,
  listRoles,
  bindRole,
  applyPolicy,
  listPolicies,
  setBudget,
};
