import { z } from 'zod';
import { listSiteAgents } from '../../db/metal/site-agents.ts';
import { findSiteBootLease, siteBootLeaseName } from '../../db/metal/site-leases.ts';
import { createSiteJoinToken } from '../../db/metal/site-tokens.ts';
import { ensureCaCertificate } from '../../db/nodes/certificate-authority.ts';
import { findSite, insertSite, listAllSites } from '../../db/nodes/fleet.ts';
import { ComputeError } from '../../domain/errors.ts';
import { requireRootAdmin } from '../admin/guard.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { apiSealer } from '../sealer.ts';

const siteId = z.string().regex(/^site_[0-9a-z]{26}$/, 'a site id (site_…)');
const siteOut = z.object({ id: z.string(), name: z.string(), region: z.string() });

const leaseOut = z.object({
  name: z.string(),
  holderNodeId: z.string(),
  epoch: z.number().int(),
  acquiredAt: z.number(),
  expiresAt: z.number(),
  expired: z.boolean(),
});

const agentOut = z.object({
  nodeId: z.string(),
  name: z.string(),
  connectivity: z.enum(['connected', 'unreachable', 'unknown']),
  agentVersion: z.string().nullable(),
  lastHeartbeatAt: z.number().nullable(),
  /** `boot-server` holds the site's boot lease now; `standby` takes over when it expires. */
  role: z.enum(['boot-server', 'standby']),
});

async function requireSite(ctx: MethodContext, id: string) {
  const site = await findSite(ctx.deps.db, { id });
  if (!site) throw new ComputeError('NOT_FOUND', `site ${id} not found`);
  return site;
}

const create = defineMethod({
  summary: 'Create a site: a location whose machines one site agent boots and reaches over Redfish.',
  action: 'compute:admin:write',
  input: z.strictObject({
    name: z.string().regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, "a name: lower-case letters, digits, '.' or '-'"),
    region: z.string().regex(/^[a-z0-9-]{2,40}$/, 'a region such as eu-central-1'),
  }),
  output: siteOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const exists = await findSite(ctx.deps.db, { name: input.name });
    if (exists) {
      throw new ComputeError('CONFLICT', `site ${input.name} already exists: use it (sites.get)`, {
        siteId: exists.id,
      });
    }
    const id = await insertSite(ctx.deps.db, input);
    return { id, ...input };
  },
});

const list = defineMethod({
  summary: 'Every site.',
  action: 'compute:admin:read',
  input: z.strictObject({}),
  output: z.object({ sites: z.array(siteOut) }),
  handler: async (ctx) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return { sites: await listAllSites(ctx.deps.db) };
  },
});

const get = defineMethod({
  summary: 'A site with its site agents and its boot lease (`site:<id>:boot`: holder and fencing epoch).',
  action: 'compute:admin:read',
  input: z.strictObject({ siteId }),
  output: siteOut.extend({ agents: z.array(agentOut), bootLease: leaseOut.nullable() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const site = await requireSite(ctx, input.siteId);
    const lease = await findSiteBootLease(ctx.deps.db, site.id);
    const agents = await listSiteAgents(ctx.deps.db, site.id);
    const serving = lease && !lease.expired ? lease.holderNodeId : null;
    return {
      ...site,
      agents: agents.map((a) => ({
        ...a,
        lastHeartbeatAt: a.lastHeartbeatAt?.getTime() ?? null,
        role: a.nodeId === serving ? ('boot-server' as const) : ('standby' as const),
      })),
      bootLease: lease
        ? {
            name: siteBootLeaseName(site.id),
            holderNodeId: lease.holderNodeId,
            epoch: lease.epoch,
            acquiredAt: lease.acquiredAt.getTime(),
            expiresAt: lease.expiresAt.getTime(),
            expired: lease.expired,
          }
        : null,
    };
  },
});

const createToken = defineMethod({
  summary:
    'A site join token for `bcd site` (role site): shown once, valid ttlSeconds, maxUses agents (the boot server and its standbys).',
  action: 'compute:admin:write',
  input: z.strictObject({
    siteId,
    ttlSeconds: z
      .number()
      .int()
      .min(60)
      .max(30 * 86_400)
      .default(3600),
    maxUses: z.number().int().min(1).max(16).default(2),
  }),
  output: z.object({
    id: z.string(),
    siteId: z.string(),
    token: z.string(),
    expiresAt: z.number(),
    maxUses: z.number().int(),
    gateway: z.string(),
    caCertificatePem: z.string(),
    command: z.string(),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    await requireSite(ctx, input.siteId);
    const { config } = ctx.deps;
    const caCertificatePem = await ensureCaCertificate(ctx.deps.db, {
      trustDomain: config.BETTER_COMPUTE_TRUST_DOMAIN,
      sealer: () => apiSealer(config, "the control plane CA's private key"),
    });
    const created = await createSiteJoinToken(ctx.deps.db, {
      siteId: input.siteId,
      ttlSeconds: input.ttlSeconds,
      maxUses: input.maxUses,
      createdBy: ctx.principal.identityId,
    });
    const host = config.BETTER_COMPUTE_GATEWAY_HOST;
    const gateway = `${host.includes(':') ? `[${host}]` : host}:${config.BETTER_COMPUTE_GATEWAY_PORT}`;
    return {
      id: created.view.id,
      siteId: input.siteId,
      token: created.token,
      expiresAt: created.view.expiresAt.getTime(),
      maxUses: created.view.maxUses,
      gateway,
      caCertificatePem,
      command: `bcd site --token ${created.token} --gateway ${gateway} --ca-file ca.pem`,
    };
  },
});

/** `sites.*`: sites, their site agents and the boot lease. */
export const siteMethods = { create, list, get, createToken };
