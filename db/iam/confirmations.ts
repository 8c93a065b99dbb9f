import { type Selectable, sql } from 'kysely';
import type { IamConfirmationsTable, IamDb } from '../../core/iam-database.ts';
import type { Confirmation, ConfirmationDecision, ConfirmationRequest } from '../../core/iam-port.ts';

type ConfirmationRow = Selectable<IamConfirmationsTable>;

function toConfirmation(row: ConfirmationRow, lapsed: boolean): Confirmation {
  return {
    id: row.id,
    state: row.state === 'pending' && lapsed ? 'expired' : row.state,
    action: row.action,
    resource: { type: row.resource_type, id: row.resource_id },
    agentIdentityId: row.agent_identity_id,
    personIdentityId: row.person_identity_id,
    expiresAt: row.expires_at,
  };
}

/**
 * Opens a pending confirmation that expires `ttlMs` after `compute_now()`, for the request whose
 * hash is `requestHash` (null: the caller names no request). The caller makes sure no pending one
 * is open for the same agent, action, resource and request.
 */
export async function insertConfirmation(
  db: IamDb,
  confirmation: {
    id: string;
    tenantId: string;
    delegationId: string;
    agentIdentityId: string;
    personIdentityId: string;
    action: string;
    resource: { type: string; id: string };
    requestHash: string | null;
    ttlMs: number;
  },
): Promise<Confirmation> {
  const row = await db
    .insertInto('iam.confirmations')
    .values({
      id: confirmation.id,
      tenant_id: confirmation.tenantId,
      delegation_id: confirmation.delegationId,
      agent_identity_id: confirmation.agentIdentityId,
      person_identity_id: confirmation.personIdentityId,
      action: confirmation.action,
      resource_type: confirmation.resource.type,
      resource_id: confirmation.resource.id,
      request_hash: confirmation.requestHash,
      expires_at: sql<Date>`compute_now() + make_interval(secs => ${confirmation.ttlMs / 1000})`,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return toConfirmation(row, false);
}

/**
 * The newest confirmation of this agent for this action on this resource and this request (by its
 * hash; null matches only confirmations asked without one), or null. `lapsed`: its deadline has
 * passed by `compute_now()` (a pending one then reads `expired`; an approved one no longer
 * allows); `used`: an approved one already admitted its request.
 */
export async function findLatestConfirmation(
  db: IamDb,
  agentIdentityId: string,
  action: string,
  resource: { type: string; id: string },
  requestHash: string | null,
): Promise<{ confirmation: Confirmation; lapsed: boolean; used: boolean } | null> {
  const row = await db
    .selectFrom('iam.confirmations')
    .selectAll()
    .select(sql<boolean>`expires_at <= compute_now()`.as('lapsed'))
    .where('agent_identity_id', '=', agentIdentityId)
    .where('action', '=', action)
    .where('resource_type', '=', resource.type)
    .where('resource_id', '=', resource.id)
    .where(sql<boolean>`request_hash IS NOT DISTINCT FROM ${requestHash}`)
    .orderBy('created_at', 'desc')
    .limit(1)
    .executeTakeFirst();
  if (!row) return null;
  const { lapsed, ...confirmation } = row;
  return { confirmation: toConfirmation(confirmation, lapsed), lapsed, used: row.used_at !== null };
}

/**
 * Uses an approval: marks the approved, unexpired (by `compute_now()`) and unused confirmation
 * used, so it admits nothing more. Answers false when it was not such a one (already used by a
 * concurrent decision, expired, or never approved): the caller must not admit.
 */
export async function useApproval(db: IamDb, confirmationId: string): Promise<boolean> {
  const row = await db
    .updateTable('iam.confirmations')
    .set({ used_at: sql<Date>`compute_now()` })
    .where('id', '=', confirmationId)
    .where('state', '=', 'approved')
    .where('used_at', 'is', null)
    .where(sql<boolean>`expires_at > compute_now()`)
    .returning('id')
    .executeTakeFirst();
  return row !== undefined;
}

/**
 * Records the person's answer to a pending confirmation that has not expired (by `compute_now()`)
 * and names this person. Undefined when there is none such (see `findConfirmationState`).
 */
export async function decidePendingConfirmation(
  db: IamDb,
  input: { confirmationId: string; personIdentityId: string; decision: 'approved' | 'denied' },
): Promise<ConfirmationDecision | undefined> {
  const row = await db
    .updateTable('iam.confirmations')
    .set({ state: input.decision, decided_at: sql<Date>`compute_now()` })
    .where('id', '=', input.confirmationId)
    .where('person_identity_id', '=', input.personIdentityId)
    .where('state', '=', 'pending')
    .where(sql<boolean>`expires_at > compute_now()`)
    .returning(['id', 'state', 'resource_id', 'action'])
    .executeTakeFirst();
  return row ? { id: row.id, state: row.state, resourceId: row.resource_id, action: row.action } : undefined;
}

/** Whom a confirmation waits for and its stored state (`pending` past its deadline is expired). */
export async function findConfirmationState(
  db: IamDb,
  confirmationId: string,
): Promise<{ personIdentityId: string; state: 'pending' | 'approved' | 'denied' } | undefined> {
  const row = await db
    .selectFrom('iam.confirmations')
    .select(['person_identity_id', 'state'])
    .where('id', '=', confirmationId)
    .executeTakeFirst();
  return row ? { personIdentityId: row.person_identity_id, state: row.state } : undefined;
}

/** The confirmations that wait (or waited) for a person, newest first, at most 100. */
export async function listConfirmationsFor(
  db: IamDb,
  personIdentityId: string,
): Promise<ConfirmationRequest[]> {
  const rows = await db
    .selectFrom('iam.confirmations')
    .selectAll()
    .where('person_identity_id', '=', personIdentityId)
    .orderBy('created_at', 'desc')
    .limit(100)
    .execute();
  return rows.map((r) => ({
    id: r.id,
    state: r.state,
    action: r.action,
    resource: { type: r.resource_type, id: r.resource_id },
    agentIdentityId: r.agent_identity_id,
    expiresAt: r.expires_at,
  }));
}
