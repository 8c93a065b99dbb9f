import { readComputeNow } from '../../db/clock.ts';
import { type ApiAnswer, type ApiFixture, createApiFixture } from './api.ts';
import { type SeededPool, seedPool } from './fleet.ts';
import { type TenantMember, tenantMember } from './iam.ts';

/** A tenant with a member (role member) and an administrator (role admin on the tenant). */
export interface TenantSide {
  tenantId: string;
  member: TenantMember;
  admin: TenantMember;
  /** A pool the tenant owns (its nodes are the tenant's to see and operate). */
  ownPool: SeededPool;
}

/** What tenant B (`globex`) has, each made the way a user of B makes it. */
export interface TenantResources {
  /** Reservations in the shared pool: one to read, and one for each call that changes one. */
  reservations: { read: string; release: string; cancel: string; extend: string; renew: string };
  webhooks: { read: string; remove: string };
  webhookUrl: string;
  joinTokens: { read: string; revoke: string };
  command: { nodeId: string; commandId: string };
  /** A pending confirmation an agent of B asked B's member for. */
  confirmationId: string;
  agentIdentityId: string;
  /** The delegation from B's member to that agent. */
  delegationId: string;
  /** The agent's token (its requests wait for B's member to confirm them). */
  agentToken: string;
  /** A token of B's member besides the one the fixture calls with. */
  spareTokenId: string;
  policyName: string;
}

export interface TwoTenants {
  api: ApiFixture;
  /** The root tenant's administrator. */
  root: TenantMember;
  a: TenantSide;
  b: TenantSide;
  /** A pool of the root tenant offered to both tenants. */
  sharedPool: SeededPool;
  /** B's resources, made through the API. */
  ofB: TenantResources;
  /** Every id and name of B's that only B (and root) may learn. */
  bIdentifiers: string[];
  /** POST /api/compute/{path} in process, without rate limits (these suites call fast). */
  call(token: string | null, path: string, body: unknown): Promise<ApiAnswer>;
  stop(): Promise<void>;
}

function dataOf(answer: ApiAnswer, what: string) {
  if (answer.status !== 200) throw new Error(`${what}: HTTP ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body.data;
}

/**
 * Two tenants over the real API and database: `acme` (A) and `globex` (B), each with a member, an
 * administrator and a pool of its own with nodes, both offered a pool of the root tenant; for A,
 * a reservation, a cordoned node (an event) and a join token of its own; and, for B, what its
 * users make: reservations, webhooks, join tokens, a node command, a policy, a
 * delegated agent with a pending confirmation, a spare token and node events. Rate limits are off
 * and webhooks may target 127.0.0.1 (nothing delivers them: no dispatcher runs).
 */
export async function createTwoTenants(): Promise<TwoTenants> {
  const api = await createApiFixture({
    env: {
      BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
      BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
      BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: '127.0.0.1',
      BETTER_COMPUTE_SECRET: 'two-tenants-test-deployment-secret-0123456789',
    },
  });
  try {
    const { db } = api.database;
    const side = async (tenantId: string, siteId: string): Promise<TenantSide> => ({
      tenantId,
      member: await tenantMember(api.iam, tenantId),
      admin: await tenantMember(api.iam, tenantId, { role: 'admin', name: `${tenantId}-admin` }),
      ownPool: await seedPool(db, {
        siteId,
        ownerTenantId: tenantId,
        name: `${tenantId}-pool`,
        nodes: 4,
        namePrefix: `${tenantId}-node`,
        offers: { [tenantId]: { gpu: 1_000 } },
      }),
    });
    const sharedPool = await seedPool(db, {
      ownerTenantId: api.root.tenantId,
      name: 'shared',
      nodes: 4,
      namePrefix: 'shared-node',
      offers: { acme: { gpu: 1_000 }, globex: { gpu: 1_000 } },
    });
    const a = await side('acme', sharedPool.siteId);
    const b = await side('globex', sharedPool.siteId);
    const call = api.call;
    const as = (who: TenantMember) => (path: string, body: unknown) => call(who.token, path, body);
    // A has data of its own too, so that what A may read is never empty for want of anything.
    dataOf(
      await as(a.member)('reservations/create', {
        tenantId: a.tenantId,
        poolId: sharedPool.poolId,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '2h',
        idempotencyKey: 'a-own',
      }),
      "A's reservation",
    );
    dataOf(
      await as(a.admin)('nodes/cordon', { nodeId: a.ownPool.nodes[0]!.id, reason: 'acme maintenance' }),
      "A's cordon",
    );
    dataOf(await as(a.admin)('joinTokens/create', { poolId: a.ownPool.poolId }), "A's join token");
    const bMember = as(b.member);
    const bAdmin = as(b.admin);

    const now = (await readComputeNow(db)).getTime();
    const reserve = async (key: string, extra: Record<string, unknown> = {}) =>
      dataOf(
        await bMember('reservations/create', {
          tenantId: b.tenantId,
          poolId: sharedPool.poolId,
          devices: [{ class: 'gpu', count: 1 }],
          duration: '2h',
          idempotencyKey: key,
          ...extra,
        }),
        `reservation ${key}`,
      ).id as string;
    const reservations = {
      read: await reserve('b-read'),
      release: await reserve('b-release'),
      cancel: await reserve('b-cancel', { start: now + 86_400_000 }),
      extend: await reserve('b-extend'),
      renew: await reserve('b-renew', { leaseSeconds: 600 }),
    };

    const webhookUrl = 'http://127.0.0.1:9/globex-hook';
    const hook = async () =>
      dataOf(
        await bAdmin('webhooks/create', { tenantId: b.tenantId, url: webhookUrl, eventTypes: ['node.*'] }),
        'webhook',
      ).id as string;
    const webhooks = { read: await hook(), remove: await hook() };

    const joinToken = async () =>
      dataOf(await bAdmin('joinTokens/create', { poolId: b.ownPool.poolId }), 'join token').id as string;
    const joinTokens = { read: await joinToken(), revoke: await joinToken() };

    const commandNode = b.ownPool.nodes[0]!.id;
    // As a machine that joined has (seeded nodes have none): what a reclaim is approved for.
    await db
      .updateTable('nodes')
      .set({ hardware_key: `hwk-${commandNode}` })
      .where('id', '=', commandNode)
      .execute();
    const command = dataOf(
      await bAdmin('nodes/command', { nodeId: commandNode, kind: 'inventory.refresh' }),
      'command',
    );
    dataOf(
      await bAdmin('nodes/cordon', { nodeId: b.ownPool.nodes[2]!.id, reason: 'globex maintenance' }),
      'cordon',
    );

    const policyName = 'globex-secret-policy';
    dataOf(
      await call(api.root.token, 'admin/applyPolicy', {
        tenantId: b.tenantId,
        name: policyName,
        document: { statements: [{ effect: 'allow', actions: ['compute:reservations:read'] }] },
      }),
      'policy',
    );

    const agent = await api.iam.admin.createIdentity({
      tenantId: b.tenantId,
      kind: 'agent',
      name: 'globex-agent',
      personIdentityId: b.member.identityId,
      confirmActions: ['compute:reservations:create'],
    });
    await api.iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    if (!agent.delegationId) throw new Error('an agent without a delegation');
    const agentToken = (await api.iam.admin.createToken({ identityId: agent.id })).token;
    const held = await call(agentToken, 'reservations/create', {
      tenantId: b.tenantId,
      poolId: sharedPool.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'b-agent',
    });
    const confirmationId = held.body?.error?.details?.confirmationId as string | undefined;
    if (!confirmationId) throw new Error(`agent's create: ${JSON.stringify(held.body)}`);
    const spare = await api.iam.admin.createToken({ identityId: b.member.identityId, name: 'globex-spare' });

    const ofB: TenantResources = {
      reservations,
      webhooks,
      webhookUrl,
      joinTokens,
      command: { nodeId: commandNode, commandId: command.id },
      confirmationId,
      agentIdentityId: agent.id,
      delegationId: agent.delegationId,
      agentToken,
      spareTokenId: spare.id,
      policyName,
    };
    const bIdentifiers = [
      b.member.identityId,
      b.admin.identityId,
      agent.id,
      agent.delegationId,
      spare.id,
      policyName,
      webhookUrl,
      confirmationId,
      command.id,
      b.ownPool.poolId,
      `${b.tenantId}-pool`,
      ...b.ownPool.nodes.flatMap((n) => [n.id, n.name]),
      ...Object.values(reservations),
      ...Object.values(webhooks),
      ...Object.values(joinTokens),
    ];
    return {
      api,
      root: api.root,
      a,
      b,
      sharedPool,
      ofB,
      bIdentifiers,
      call,
      stop: api.stop,
    };
  } catch (error) {
    await api.stop();
    throw error;
  }
}
