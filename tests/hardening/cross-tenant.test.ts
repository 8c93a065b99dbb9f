/**
 * The cross-tenant matrix, generated from the method registry: every method, called by a member of
 * tenant A (`acme`), an administrator of tenant A and the platform's root administrator, on the
 * resources of tenant B (`globex`): its reservations, webhooks, pool, nodes, commands and join
 * tokens, identities, tokens, policies, confirmations and events. One table holds the expected
 * answer of every cell; a method without a row fails the test, and one with no resource of B to
 * aim at says so in its row. A's calls must be refused (NOT_FOUND or ACCESS_DENIED, as the table
 * says) or answer only A's own data; no answer of A's holds an identifier of B's it did not send;
 * and all of A's calls together change no table. Root administers everything: its cells succeed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { methods } from '../../api/registry.ts';
import type { ErrorCode } from '../../domain/errors.ts';
import type { ApiAnswer } from '../support/api.ts';
import { tableSnapshot } from '../support/table-snapshot.ts';
import { createTwoTenants, type TwoTenants } from '../support/two-tenants.ts';

/** `ok`: HTTP 200; otherwise the error code the call must answer. */
type Expected = 'ok' | Extract<ErrorCode, 'NOT_FOUND' | 'ACCESS_DENIED'>;

interface Case {
  /** What the case aims at, when a method has several. */
  aim: string;
  input: (w: TwoTenants) => Record<string, unknown>;
  member: Expected;
  admin: Expected;
  root: Expected;
  /** For root's `ok`: what of B its answer must show. */
  rootSees?: (w: TwoTenants) => string;
}

type Row = { cases: Case[] } | { noCrossTenantResource: string };

const gpu1 = { devices: [{ class: 'gpu', count: 1 }], duration: '1h' };
const denied = { member: 'ACCESS_DENIED', admin: 'ACCESS_DENIED' } as const;
const notFound = { member: 'NOT_FOUND', admin: 'NOT_FOUND' } as const;
const ownOnly = { member: 'ok', admin: 'ok' } as const;
/** Root-only administration: A is refused whatever the target, root succeeds. */
const rootOnly = (aim: string, input: Case['input'], rootSees?: Case['rootSees']): Row => ({
  cases: [{ aim, input, ...denied, root: 'ok', ...(rootSees ? { rootSees } : {}) }],
});
const B = (w: TwoTenants) => w.b.tenantId;

/** Every method of the registry: its cases on B's resources, or why it has none. */
const table: Record<string, Row> = {
  'system.whoami': { noCrossTenantResource: 'answers the caller itself' },

  'holds.create': {
    cases: [
      {
        aim: "a hold in B's tenant",
        input: (w) => ({ tenantId: B(w), target: 'no-such-node', kind: 'notebook' }),
        ...denied,
        root: 'NOT_FOUND',
      },
      {
        aim: "B's own node, for A",
        input: (w) => ({ tenantId: w.a.tenantId, target: w.b.ownPool.nodes[0]!.id, kind: 'notebook' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.heartbeat': {
    cases: [
      {
        aim: "a hold in B's tenant",
        input: (w) => ({ tenantId: B(w), holdId: 'hold_x' }),
        ...denied,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.release': {
    cases: [
      {
        aim: "a hold in B's tenant",
        input: (w) => ({ tenantId: B(w), holdId: 'hold_x' }),
        ...denied,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.get': {
    cases: [
      {
        aim: "a hold in B's tenant",
        input: (w) => ({ tenantId: B(w), holdId: 'hold_x' }),
        ...denied,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.list': {
    cases: [
      { aim: "B's holds", input: (w) => ({ tenantId: B(w) }), ...denied, root: 'ok' },
      {
        aim: "B's own node, for A",
        input: (w) => ({ tenantId: w.a.tenantId, target: w.b.ownPool.nodes[0]!.id }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.kinds.set': {
    cases: [
      {
        aim: "a kind of B's own pool",
        input: (w) => ({
          tenantId: B(w),
          pool: w.b.ownPool.poolId,
          name: 'intruder',
          cpuCores: 1,
          ramGiB: 1,
        }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's own pool, for A",
        input: (w) => ({
          tenantId: w.a.tenantId,
          pool: w.b.ownPool.poolId,
          name: 'intruder',
          cpuCores: 1,
          ramGiB: 1,
        }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'holds.kinds.list': {
    cases: [
      { aim: "B's kinds", input: (w) => ({ tenantId: B(w) }), ...denied, root: 'ok' },
      {
        aim: "B's own pool, for A",
        input: (w) => ({ tenantId: w.a.tenantId, pool: w.b.ownPool.poolId }),
        ...ownOnly,
        root: 'ok',
      },
    ],
  },
  'capacity.demand': {
    cases: [
      { aim: "B's unmet demand", input: (w) => ({ tenantId: B(w) }), ...denied, root: 'ok' },
      {
        aim: "B's own pool, for A",
        input: (w) => ({ tenantId: w.a.tenantId, poolId: w.b.ownPool.poolId }),
        ...ownOnly,
        root: 'ok',
      },
    ],
  },

  'events.list': {
    cases: [
      {
        aim: "B's events",
        input: (w) => ({ tenantId: B(w) }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.ofB.command.commandId,
      },
      {
        aim: "a subject of B's, in A's own tenant",
        input: (w) => ({ subject: `node/${w.ofB.command.nodeId}` }),
        ...ownOnly,
        root: 'ok',
        rootSees: (w) => w.ofB.command.commandId,
      },
      { aim: "A's own events", input: () => ({}), ...ownOnly, root: 'ok' },
    ],
  },

  'webhooks.create': {
    cases: [
      {
        aim: "a webhook in B's tenant",
        input: (w) => ({ tenantId: B(w), url: 'http://127.0.0.1:9/intruder' }),
        ...denied,
        root: 'ok',
      },
    ],
  },
  'webhooks.list': {
    cases: [
      {
        aim: "B's webhooks",
        input: (w) => ({ tenantId: B(w) }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.ofB.webhooks.read,
      },
    ],
  },
  'webhooks.delete': {
    cases: [
      {
        aim: "B's webhook in B's tenant",
        input: (w) => ({ tenantId: B(w), webhookId: w.ofB.webhooks.remove }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's webhook named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, webhookId: w.ofB.webhooks.read }),
        member: 'ACCESS_DENIED',
        admin: 'NOT_FOUND',
        root: 'NOT_FOUND',
      },
    ],
  },
  'webhooks.deliveries': {
    cases: [
      {
        aim: "B's webhook in B's tenant",
        input: (w) => ({ tenantId: B(w), webhookId: w.ofB.webhooks.read }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's webhook named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, webhookId: w.ofB.webhooks.read }),
        member: 'ACCESS_DENIED',
        admin: 'NOT_FOUND',
        root: 'NOT_FOUND',
      },
    ],
  },

  'admin.createTenant': rootOnly('a tenant below B', (w) => ({ name: 'below-globex', parentId: B(w) })),
  'admin.listTenants': rootOnly('every tenant, B among them', () => ({}), B),
  'admin.createIdentity': rootOnly('an identity in B', (w) => ({
    tenantId: B(w),
    kind: 'person',
    name: 'planted',
  })),
  'admin.listIdentities': rootOnly(
    "B's identities",
    (w) => ({ tenantId: B(w) }),
    (w) => w.b.member.identityId,
  ),
  'admin.createToken': rootOnly("a token for B's member", (w) => ({ identityId: w.b.member.identityId })),
  'admin.listTokens': {
    cases: [
      {
        aim: "B's tokens",
        input: (w) => ({ tenantId: B(w) }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.ofB.spareTokenId,
      },
      {
        aim: "B's member's tokens",
        input: (w) => ({ identityId: w.b.member.identityId }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.ofB.spareTokenId,
      },
    ],
  },
  'admin.revokeToken': rootOnly("B's spare token", (w) => ({ tokenId: w.ofB.spareTokenId })),
  'admin.revokeDelegation': rootOnly("B's agent's delegation", (w) => ({ delegationId: w.ofB.delegationId })),
  'admin.createRole': rootOnly('a role in B', (w) => ({
    tenantId: B(w),
    name: 'planted-role',
    actions: ['compute:*'],
  })),
  'admin.listRoles': rootOnly("B's roles", (w) => ({ tenantId: B(w) })),
  'admin.bindRole': rootOnly("a role for B's member", (w) => ({
    identityId: w.b.member.identityId,
    role: 'viewer',
  })),
  'admin.applyPolicy': rootOnly('a policy in B', (w) => ({
    tenantId: B(w),
    name: 'planted-policy',
    document: { statements: [{ effect: 'allow', actions: ['compute:events:read'] }] },
  })),
  'admin.listPolicies': rootOnly(
    "B's policies",
    (w) => ({ tenantId: B(w) }),
    (w) => w.ofB.policyName,
  ),
  'admin.setBudget': rootOnly("B's budget", (w) => ({ tenantId: B(w), limit: 1 })),
  'admin.createSite': { noCrossTenantResource: 'sites belong to the platform, not to a tenant' },
  'admin.listSites': { noCrossTenantResource: 'sites belong to the platform, not to a tenant' },
  'admin.createPool': rootOnly('a pool owned by B', (w) => ({
    siteId: w.sharedPool.siteId,
    name: 'planted-pool',
    gpuModel: 'h100',
    ownerTenantId: B(w),
  })),
  'admin.listPools': rootOnly(
    'every pool, B’s among them',
    () => ({}),
    (w) => w.b.ownPool.poolId,
  ),
  // B's own quota on its pool: offering B's pool to A as root would change what the later
  // cells of A's reservations in it answer.
  'admin.offer': rootOnly("B's quota on its pool", (w) => ({
    poolId: w.b.ownPool.poolId,
    tenantId: B(w),
    quota: { gpu: 8 },
  })),
  'admin.listQuotas': rootOnly(
    "B's quotas",
    (w) => ({ tenantId: B(w) }),
    (w) => w.b.ownPool.poolId,
  ),

  'confirmations.list': {
    cases: [{ aim: "the caller's own (never B's)", input: () => ({}), ...ownOnly, root: 'ok' }],
  },
  // Only the person an agent acts for decides its confirmations: root too is refused.
  'confirmations.approve': {
    cases: [
      {
        aim: "B's pending confirmation",
        input: (w) => ({ confirmationId: w.ofB.confirmationId }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'confirmations.deny': {
    cases: [
      {
        aim: "B's pending confirmation",
        input: (w) => ({ confirmationId: w.ofB.confirmationId }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },

  'reservations.create': {
    cases: [
      {
        aim: 'a reservation for B',
        input: (w) => ({ tenantId: B(w), poolId: w.sharedPool.poolId, ...gpu1, idempotencyKey: 'x-for-b' }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "a reservation for A in B's own pool",
        input: (w) => ({
          tenantId: w.a.tenantId,
          poolId: w.b.ownPool.poolId,
          ...gpu1,
          idempotencyKey: 'x-in-b-pool',
        }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'reservations.get': {
    cases: [
      {
        aim: "B's reservation in B's tenant",
        input: (w) => ({ tenantId: B(w), reservationId: w.ofB.reservations.read }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.b.member.identityId,
      },
      {
        aim: "B's reservation named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, reservationId: w.ofB.reservations.read }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'reservations.list': {
    cases: [
      {
        aim: "B's reservations",
        input: (w) => ({ tenantId: B(w), scope: 'all' }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.ofB.reservations.read,
      },
      {
        aim: "A's own, in the shared pool",
        input: (w) => ({ tenantId: w.a.tenantId, scope: 'all', poolId: w.sharedPool.poolId }),
        ...ownOnly,
        root: 'ok',
      },
    ],
  },
  'reservations.release': {
    cases: [
      {
        aim: "B's reservation in B's tenant",
        input: (w) => ({ tenantId: B(w), reservationId: w.ofB.reservations.release }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's reservation named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, reservationId: w.ofB.reservations.release }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'reservations.cancel': {
    cases: [
      {
        aim: "B's reservation in B's tenant",
        input: (w) => ({ tenantId: B(w), reservationId: w.ofB.reservations.cancel }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's reservation named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, reservationId: w.ofB.reservations.cancel }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'reservations.extend': {
    cases: [
      {
        aim: "B's reservation in B's tenant",
        input: (w) => ({
          tenantId: B(w),
          reservationId: w.ofB.reservations.extend,
          by: '1h',
          idempotencyKey: 'x-extend',
        }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's reservation named in A's tenant",
        input: (w) => ({
          tenantId: w.a.tenantId,
          reservationId: w.ofB.reservations.extend,
          by: '1h',
          idempotencyKey: 'x-extend-a',
        }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'reservations.renew': {
    cases: [
      {
        aim: "B's reservation in B's tenant",
        input: (w) => ({ tenantId: B(w), reservationId: w.ofB.reservations.renew }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "B's reservation named in A's tenant",
        input: (w) => ({ tenantId: w.a.tenantId, reservationId: w.ofB.reservations.renew }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },

  'capacity.preview': {
    cases: [
      {
        aim: 'a preview for B',
        input: (w) => ({ tenantId: B(w), poolId: w.sharedPool.poolId, ...gpu1 }),
        ...denied,
        root: 'ok',
      },
      {
        aim: "a preview for A in B's own pool",
        input: (w) => ({ tenantId: w.a.tenantId, poolId: w.b.ownPool.poolId, ...gpu1 }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'capacity.get': {
    cases: [
      {
        aim: "B's capacity",
        input: (w) => ({ tenantId: B(w) }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.b.ownPool.poolId,
      },
      {
        aim: "B's own pool, for A",
        input: (w) => ({ tenantId: w.a.tenantId, poolId: w.b.ownPool.poolId }),
        ...ownOnly,
        root: 'ok',
      },
    ],
  },
  'capacity.nodes': {
    cases: [
      {
        aim: "B's nodes",
        input: (w) => ({ tenantId: B(w) }),
        ...denied,
        root: 'ok',
        rootSees: (w) => w.b.ownPool.nodes[0]!.id,
      },
      {
        aim: "B's own pool, for A",
        input: (w) => ({ tenantId: w.a.tenantId, poolId: w.b.ownPool.poolId }),
        ...ownOnly,
        root: 'ok',
      },
    ],
  },

  'nodes.list': {
    cases: [
      {
        aim: "B's pool",
        input: (w) => ({ poolId: w.b.ownPool.poolId }),
        ...notFound,
        root: 'ok',
        rootSees: (w) => w.b.ownPool.nodes[0]!.id,
      },
      {
        aim: 'every node the caller may see',
        input: () => ({}),
        member: 'ACCESS_DENIED',
        admin: 'ok',
        root: 'ok',
        rootSees: (w) => w.b.ownPool.nodes[0]!.id,
      },
    ],
  },
  'nodes.get': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }),
        ...notFound,
        root: 'ok',
        rootSees: (w) => w.b.ownPool.nodes[0]!.name,
      },
    ],
  },
  'nodes.cordon': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[1]!.id, reason: 'intruder' }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.uncordon': {
    cases: [
      {
        aim: "B's cordoned node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[2]!.id }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.drain': {
    cases: [
      { aim: "B's node", input: (w) => ({ nodeId: w.b.ownPool.nodes[1]!.id }), ...notFound, root: 'ok' },
    ],
  },
  'nodes.command': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id, kind: 'inventory.refresh' }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.getCommand': {
    cases: [
      {
        aim: "B's command",
        input: (w) => ({ ...w.ofB.command }),
        ...notFound,
        root: 'ok',
        rootSees: (w) => w.ofB.command.commandId,
      },
    ],
  },
  'nodes.listCommands': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.ofB.command.nodeId }),
        ...notFound,
        root: 'ok',
        rootSees: (w) => w.ofB.command.commandId,
      },
    ],
  },

  'nodes.retire': {
    cases: [
      {
        aim: "B's spare node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[3]!.id, force: true }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.revokeCertificates': {
    cases: [
      { aim: "B's node", input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }), ...notFound, root: 'ok' },
    ],
  },
  'nodes.approveReclaim': {
    cases: [
      { aim: "B's node", input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }), ...notFound, root: 'ok' },
    ],
  },
  'nodes.setMigLayout': {
    cases: [
      {
        aim: "B's node (root: a layout naming no GPU changes nothing)",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id, gpus: [] }),
        ...notFound,
        root: 'ok',
      },
    ],
  },

  'joinTokens.create': {
    cases: [{ aim: "B's pool", input: (w) => ({ poolId: w.b.ownPool.poolId }), ...notFound, root: 'ok' }],
  },
  'joinTokens.list': {
    cases: [
      {
        aim: "B's pool",
        input: (w) => ({ poolId: w.b.ownPool.poolId }),
        ...notFound,
        root: 'ok',
        rootSees: (w) => w.ofB.joinTokens.read,
      },
      {
        aim: 'every token the caller may see',
        input: () => ({}),
        member: 'ACCESS_DENIED',
        admin: 'ok',
        root: 'ok',
        rootSees: (w) => w.ofB.joinTokens.read,
      },
    ],
  },
  'sites.create': { noCrossTenantResource: 'sites belong to the platform, not to a tenant' },
  'sites.list': { noCrossTenantResource: 'sites belong to the platform, not to a tenant' },
  'sites.get': { noCrossTenantResource: 'sites belong to the platform, not to a tenant' },
  'sites.createToken': { noCrossTenantResource: 'site agents belong to the platform, not to a tenant' },
  'releases.publish': {
    noCrossTenantResource: 'bcd releases belong to the platform (root administrators only)',
  },
  'releases.list': {
    noCrossTenantResource: 'bcd releases belong to the platform (root administrators only)',
  },
  'releases.get': { noCrossTenantResource: 'bcd releases belong to the platform (root administrators only)' },
  'rollouts.create': {
    noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)',
  },
  'rollouts.get': { noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)' },
  'rollouts.list': {
    noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)',
  },
  'rollouts.pause': {
    noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)',
  },
  'rollouts.resume': {
    noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)',
  },
  'rollouts.abort': {
    noCrossTenantResource: 'bcd rollouts belong to the platform (root administrators only)',
  },
  'metal.enroll': {
    cases: [
      {
        aim: "a machine into B's pool",
        input: (w) => ({
          siteId: w.sharedPool.siteId,
          poolId: w.b.ownPool.poolId,
          name: 'planted-metal',
          bmc: { address: 'https://192.0.2.10', systemId: '1', username: 'root', password: 'calvin' },
          inspect: false,
        }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'metal.machines': {
    cases: [
      {
        aim: 'every machine the caller may see',
        input: () => ({}),
        member: 'ACCESS_DENIED',
        admin: 'ok',
        root: 'ok',
      },
    ],
  },
  // B's node has no BMC: A learns nothing (NOT_FOUND before IAM), root is told it has no BMC.
  'metal.getMachine': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.power': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id, action: 'on' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.bootDevice': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id, device: 'pxe' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.virtualMedia': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id, action: 'eject' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.inventory': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  // Provisioning and the catalogue: B's node, B's tenant, ids that name nothing of A's.
  'metal.deploy': {
    cases: [
      {
        aim: "B's node",
        input: (w) => ({
          nodeId: w.b.ownPool.nodes[0]!.id,
          profileId: 'prof_00000000000000000000000000',
          idempotencyKey: 'cross-tenant',
        }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  // Root's inspection of B's node would need Temporal, which this suite does not run.
  'metal.inspect': {
    cases: [
      {
        aim: 'a node of nobody',
        input: () => ({ nodeId: 'node_00000000000000000000000000', idempotencyKey: 'cross-tenant' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.abort': {
    cases: [
      {
        aim: 'a workflow of nobody',
        input: () => ({ workflowId: 'wf_00000000000000000000000000', reason: 'x' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'metal.retry': {
    cases: [
      {
        aim: 'a workflow of nobody',
        input: () => ({ workflowId: 'wf_00000000000000000000000000' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'workflows.get': {
    cases: [
      {
        aim: 'a workflow of nobody',
        input: () => ({ workflowId: 'wf_00000000000000000000000000' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'workflows.list': {
    cases: [
      { aim: "B's node", input: (w) => ({ nodeId: w.b.ownPool.nodes[0]!.id }), ...notFound, root: 'ok' },
    ],
  },
  'images.register': {
    cases: [
      {
        aim: "an image for B's tenant",
        input: (w) => ({
          tenantId: B(w),
          name: 'planted',
          version: '1',
          format: 'raw',
          sha256: 'a'.repeat(64),
          url: 'http://192.0.2.10/planted.raw',
        }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'images.list': {
    cases: [{ aim: "B's tenant", input: (w) => ({ tenantId: B(w) }), ...notFound, root: 'ok' }],
  },
  'images.get': {
    cases: [
      {
        aim: 'an image of nobody',
        input: () => ({ imageId: 'img_00000000000000000000000000' }),
        member: 'ACCESS_DENIED',
        admin: 'NOT_FOUND',
        root: 'NOT_FOUND',
      },
    ],
  },
  'profiles.create': {
    cases: [
      {
        aim: "a profile for B's tenant",
        input: (w) => ({
          tenantId: B(w),
          name: 'planted',
          spec: { imageId: 'img_00000000000000000000000000' },
        }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'profiles.list': {
    cases: [{ aim: "B's tenant", input: (w) => ({ tenantId: B(w) }), ...notFound, root: 'ok' }],
  },
  'profiles.get': {
    cases: [
      {
        aim: 'a profile of nobody',
        input: () => ({ profileId: 'prof_00000000000000000000000000' }),
        ...notFound,
        root: 'NOT_FOUND',
      },
    ],
  },
  'nodes.setMaintenance': {
    cases: [
      {
        aim: "B's cordoned node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[2]!.id, reason: 'cross-tenant' }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.clearMaintenance': {
    cases: [
      {
        aim: "B's cordoned node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[2]!.id }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.taint': {
    cases: [
      {
        aim: "B's cordoned node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[2]!.id, reason: 'cross-tenant' }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'nodes.untaint': {
    cases: [
      {
        aim: "B's cordoned node",
        input: (w) => ({ nodeId: w.b.ownPool.nodes[2]!.id, reason: 'cross-tenant' }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  'joinTokens.revoke': {
    cases: [
      {
        aim: "B's join token",
        input: (w) => ({ tokenId: w.ofB.joinTokens.revoke }),
        ...notFound,
        root: 'ok',
      },
    ],
  },
  // Pool administration last: root's archive and withdrawal end B's pool and offer for good.
  'admin.setPoolPolicy': rootOnly("B's pool's policy", (w) => ({ poolId: w.b.ownPool.poolId, policy: {} })),
  'admin.poolPolicyHistory': rootOnly(
    "B's pool's policy history",
    (w) => ({ poolId: w.b.ownPool.poolId }),
    (w) => w.b.ownPool.poolId,
  ),
  'admin.withdrawOffer': rootOnly("the shared pool's offer to B", (w) => ({
    poolId: w.sharedPool.poolId,
    tenantId: B(w),
  })),
  'admin.archivePool': rootOnly("B's pool", (w) => ({ poolId: w.b.ownPool.poolId })),
};

const principals = ['member', 'admin', 'root'] as const;
type Principal = (typeof principals)[number];

interface Cell {
  method: string;
  aim: string;
  principal: Principal;
  expected: Expected;
  input: Record<string, unknown>;
  rootSees?: string;
}

let w: TwoTenants;
const registryMethods = Object.entries(methods).flatMap(([group, groupMethods]) =>
  Object.keys(groupMethods).map((name) => `${group}.${name}`),
);
const outcomes: Array<{ cell: Cell; answer: ApiAnswer }> = [];

function cellsFor(principalsOf: readonly Principal[]): Cell[] {
  return Object.entries(table).flatMap(([method, row]) =>
    'cases' in row
      ? row.cases.flatMap((c) =>
          principalsOf.map((principal) => ({
            method,
            aim: c.aim,
            principal,
            expected: c[principal],
            input: c.input(w),
            ...(principal === 'root' && c.rootSees ? { rootSees: c.rootSees(w) } : {}),
          })),
        )
      : [],
  );
}

function tokenOf(principal: Principal): string {
  return principal === 'root' ? w.root.token : w.a[principal].token;
}

async function run(cell: Cell): Promise<ApiAnswer> {
  const answer = await w.call(tokenOf(cell.principal), cell.method.replace('.', '/'), cell.input);
  outcomes.push({ cell, answer });
  return answer;
}

/** What is wrong with an answer (null: nothing), judged against its cell. */
function judge(cell: Cell, answer: ApiAnswer): string | null {
  const got = answer.status === 200 ? 'ok' : answer.body?.error?.code;
  if (got !== cell.expected) {
    return `expected ${cell.expected}, got HTTP ${answer.status} ${JSON.stringify(answer.body).slice(0, 300)}`;
  }
  if (cell.principal !== 'root') {
    const sent = JSON.stringify(cell.input);
    const text = JSON.stringify(answer.body);
    const leaked = w.bIdentifiers.filter((id) => text.includes(id) && !sent.includes(id));
    if (leaked.length > 0) return `answers B's ${leaked.join(', ')}: ${text.slice(0, 300)}`;
  } else if (cell.rootSees && !JSON.stringify(answer.body).includes(cell.rootSees)) {
    return `root's answer does not show ${cell.rootSees}: ${JSON.stringify(answer.body).slice(0, 300)}`;
  }
  return null;
}

const label = (c: Cell) => `${c.method} (${c.aim}) as ${c.principal}`;

/** The matrix's cells per principal: one request each. */
const cellsPerPrincipal = Object.values(table).reduce(
  (n, row) => n + ('cases' in row ? row.cases.length : 0),
  0,
);

/**
 * A test's time limit from its requests: ~30 ms each in process, about 7 times that allowed so that
 * other runs loading the machine slow it down without failing it.
 */
const timeoutFor = (requests: number) => 30_000 + requests * 200;

/** Refusals at once: they change nothing (the snapshot proves it), so their order does not matter. */
const refusalsAtOnce = 4;

beforeAll(async () => {
  w = await createTwoTenants();
});

afterAll(async () => {
  const cells = outcomes.length;
  const refused = outcomes.filter((o) => o.answer.status !== 200).length;
  const rows = Object.values(table);
  console.log(
    `cross-tenant matrix: ${cells} cells (${rows.filter((r) => 'cases' in r).length} methods with cases × member, admin and root of tenant A/the platform; ` +
      `${rows.filter((r) => 'noCrossTenantResource' in r).length} methods with no cross-tenant resource); ${refused} refused, ${cells - refused} answered`,
  );
  await w?.stop();
});

describe('the cross-tenant matrix', () => {
  it('has a row for every method of the registry, and none for a method it does not have', () => {
    expect(Object.keys(table).sort()).toEqual([...registryMethods].sort());
  });

  it(
    "refuses tenant A's member and administrator on B's resources, answers them nothing of B's, and changes nothing",
    async () => {
      const before = await tableSnapshot(w.api.database.db);
      const failures: string[] = [];
      const cells = cellsFor(['member', 'admin']);
      let next = 0;
      await Promise.all(
        Array.from({ length: refusalsAtOnce }, async () => {
          while (next < cells.length) {
            const cell = cells[next++]!;
            const problem = judge(cell, await run(cell));
            if (problem) failures.push(`${label(cell)}: ${problem}`);
          }
        }),
      );
      expect(failures.sort()).toEqual([]);
      expect(await tableSnapshot(w.api.database.db)).toEqual(before);
    },
    timeoutFor(2 * cellsPerPrincipal),
  );

  it(
    "lets root administer B's resources",
    async () => {
      const failures: string[] = [];
      // In the table's order: root's calls change B's resources (pool administration comes last).
      for (const cell of cellsFor(['root'])) {
        const problem = judge(cell, await run(cell));
        if (problem) failures.push(`${label(cell)}: ${problem}`);
      }
      expect(failures).toEqual([]);
    },
    timeoutFor(cellsPerPrincipal),
  );

  it("refuses A's event stream on B's tenant", async () => {
    for (const principal of ['member', 'admin'] as const) {
      const response = await w.api.compute.app.request(
        `/api/compute/events/stream?tenantId=${w.b.tenantId}`,
        {
          headers: { authorization: `Bearer ${tokenOf(principal)}` },
        },
      );
      expect(response.status, principal).toBe(403);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe('ACCESS_DENIED');
    }
  });
});
