import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { revokeNodeCertificates } from '../db/nodes/certificates.ts';
import { approveNodeReclaim, retireNode } from '../db/nodes/nodes.ts';
import { findLiveReservationsOnNodes } from '../db/nodes/workloads.ts';
import { ComputeError } from '../domain/errors.ts';
import { defineMethod, type MethodContext } from './method.ts';
import { operatorReason, requireNode } from './nodes-access.ts';
import { loadNodeViews, nodeView } from './nodes-view.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');

async function viewOf(ctx: MethodContext, id: string) {
  const [node] = await loadNodeViews(ctx.deps.db, [id], { devices: false });
  if (!node) throw new ComputeError('NOT_FOUND', `node ${id} not found`);
  return node;
}

const retire = defineMethod({
  summary:
    'Retire a node for good: provision state retired, cordoned, every certificate revoked, its session ended, its hardware key freed (the machine may join again as a new node). Refused (INVALID_STATE) while live allocations hold it, unless force: they are not released, their lifecycles find the node gone. Idempotent.',
  action: 'compute:nodes:retire',
  input: z.strictObject({ nodeId, force: z.boolean().default(false), reason: operatorReason.optional() }),
  output: z.object({
    node: nodeView,
    changed: z.boolean(),
    revokedCertificates: z.number().int(),
    liveAllocations: z.number().int(),
  }),
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:retire');
    const result = await ctx.deps.db.transaction().execute(async (trx) => {
      const retired = await retireNode(trx, {
        nodeId: input.nodeId,
        force: input.force,
        reason: input.reason ?? null,
      });
      if (retired.changed) {
        await insertAuditEvent(trx, {
          tenantId: scope.tenantId,
          actorIdentityId: ctx.principal.identityId,
          action: 'compute:nodes:retire',
          resourceType: 'compute-node',
          resourceId: input.nodeId,
          requestId: ctx.requestId,
          context: {
            sessionKind: ctx.principal.sessionKind,
            reason: input.reason ?? null,
            force: input.force,
            liveAllocations: retired.liveAllocations,
            revokedCertificates: retired.revokedCertificates,
          },
        });
      }
      return retired;
    });
    if (result.changed && result.liveAllocations > 0 && ctx.deps.lifecycle) {
      // A hint only: each lifecycle re-reads the node and acts on what it finds.
      const lifecycle = ctx.deps.lifecycle;
      const reservations = await findLiveReservationsOnNodes(ctx.deps.db, [input.nodeId]);
      await Promise.all(
        reservations.map((id) =>
          lifecycle
            .signal(id, { type: 'wake', reason: 'node-retired' })
            .catch((err: unknown) => ctx.log.warn({ err, reservationId: id }, 'lifecycle wake failed')),
        ),
      );
    }
    return { node: await viewOf(ctx, input.nodeId), ...result };
  },
});

const revokeCertificates = defineMethod({
  summary:
    "Revoke every certificate of a node (a lost or compromised machine): its live session ends within the gateway's certificate check (15 s), and it cannot renew. To run again it joins with a join token: as a new node, unless nodes.approveReclaim lets it take this one back.",
  action: 'compute:nodes:revoke-certificates',
  input: z.strictObject({ nodeId, reason: operatorReason.optional() }),
  output: z.object({ node: nodeView, revokedCertificates: z.number().int() }),
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:revoke-certificates');
    const revokedCertificates = await ctx.deps.db.transaction().execute(async (trx) => {
      const revoked = await revokeNodeCertificates(trx, input.nodeId, { reason: 'revoked' });
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:revoke-certificates',
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { sessionKind: ctx.principal.sessionKind, reason: input.reason ?? null, revoked },
      });
      return revoked;
    });
    return { node: await viewOf(ctx, input.nodeId), revokedCertificates };
  },
});

const approveReclaim = defineMethod({
  summary:
    "Let the machine that holds this node's hardware key take the node back at its next join with a token of the node's pool, without proof of its previous key (it was lost: a reinstall, revoked certificates). Valid ttlSeconds (default 1 hour), used once.",
  action: 'compute:nodes:approve-reclaim',
  input: z.strictObject({
    nodeId,
    ttlSeconds: z
      .number()
      .int()
      .min(60)
      .max(7 * 86_400)
      .default(3_600),
  }),
  output: z.object({ node: nodeView, reclaimApprovedUntil: z.number() }),
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:approve-reclaim');
    const until = await ctx.deps.db.transaction().execute(async (trx) => {
      const approvedUntil = await approveNodeReclaim(trx, input.nodeId, input.ttlSeconds);
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:approve-reclaim',
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { sessionKind: ctx.principal.sessionKind, ttlSeconds: input.ttlSeconds },
      });
      return approvedUntil;
    });
    return { node: await viewOf(ctx, input.nodeId), reclaimApprovedUntil: until.getTime() };
  },
});

/** Retiring nodes and the trust in their certificates: operator-only (root or the pool's owner). */
export const nodeTrustMethods = { retire, revokeCertificates, approveReclaim };
