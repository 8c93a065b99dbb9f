import { z } from 'zod';
import { defineMethod } from '../method.ts';
import { afterCommit } from '../reservations/access.ts';
import { iamAdmin } from './guard.ts';

const confirmationOut = z.object({
  id: z.string(),
  state: z.enum(['pending', 'approved', 'denied']),
  action: z.string(),
  resource: z.object({ type: z.string(), id: z.string() }),
  agentIdentityId: z.string(),
  expiresAt: z.number(),
});

const list = defineMethod({
  summary: 'Confirmations your agents asked you for, newest first.',
  action: null,
  input: z.strictObject({}),
  output: z.object({ confirmations: z.array(confirmationOut) }),
  handler: async (ctx) => {
    const rows = await iamAdmin(ctx).listConfirmations(ctx.principal.identityId);
    return { confirmations: rows.map((r) => ({ ...r, expiresAt: r.expiresAt.getTime() })) };
  },
});

function decideMethod(decision: 'approved' | 'denied') {
  return defineMethod({
    summary:
      decision === 'approved'
        ? 'Approve the very request your agent asked for, once (a second approve is INVALID_STATE); it then retries with the same idempotency key, and the approval admits that request only.'
        : 'Deny what your agent asked for; its retry stays ACCESS_DENIED.',
    action: null,
    input: z.strictObject({ confirmationId: z.string().min(1).max(100) }),
    output: z.object({ id: z.string(), state: z.string(), resourceId: z.string(), action: z.string() }),
    handler: async (ctx, input) => {
      const result = await iamAdmin(ctx).decideConfirmation({
        confirmationId: input.confirmationId,
        personIdentityId: ctx.principal.identityId,
        decision,
      });
      // Only a reservation's admission waits in awaiting-confirmation for its lifecycle to hear it.
      if (result.action === 'compute:reservations:create') {
        await afterCommit(ctx, 'confirmation', () =>
          ctx.deps.lifecycle?.signal(result.resourceId, { type: 'confirmation', decision }),
        );
      }
      return result;
    },
  });
}

/** `confirmations.*`: a person answers the confirmations an agent acting for them asked for. */
export const confirmationMethods = { list, approve: decideMethod('approved'), deny: decideMethod('denied') };
