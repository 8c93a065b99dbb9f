import type { Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { Principal } from '../../core/iam-port.ts';

/**
 * The admission context recorded with each mutation: identity, session kind, agent, delegation
 * and request id. Asynchronous work acts on this record, never on a stored token.
 */
export function admissionContext(principal: Principal, requestId: string): Record<string, unknown> {
  return {
    identityId: principal.identityId,
    tenantId: principal.tenantId,
    identityKind: principal.kind,
    sessionKind: principal.sessionKind,
    tokenId: principal.tokenId,
    ...(principal.kind === 'agent' ? { agentIdentityId: principal.identityId } : {}),
    ...(principal.delegation ? { delegation: principal.delegation } : {}),
    requestId,
  };
}

/** One audit row, in the caller's transaction (or on its own for a refusal). */
export async function insertAuditEvent(
  trx: Transaction<Database> | Db,
  event: {
    tenantId: string | null;
    actorIdentityId: string | null;
    action: string;
    resourceType: string;
    resourceId: string;
    outcome?: 'allowed' | 'denied' | 'failed';
    requestId?: string;
    context: Record<string, unknown>;
  },
): Promise<void> {
  await trx
    .insertInto('audit_events')
    .values({
      tenant_id: event.tenantId,
      actor_identity_id: event.actorIdentityId,
      action: event.action,
      resource_type: event.resourceType,
      resource_id: event.resourceId,
      outcome: event.outcome ?? 'allowed',
      request_id: event.requestId ?? null,
      context: JSON.stringify(event.context),
    })
    .execute();
}
