import { type Selectable, sql } from 'kysely';
import type { IamDb, IamIdentitiesTable, IamTransaction } from '../../core/iam-database.ts';
import type { IdentityInfo, IdentityKind } from '../../core/iam-port.ts';
import { conflictOnDuplicate, notFoundOnMissingReference } from './iam-db.ts';

export type IdentityRow = Selectable<IamIdentitiesTable>;

/** An agent's standing delegation from its person, as decisions read it. */
export interface ActiveDelegation {
  id: string;
  personIdentityId: string;
  /** Actions (patterns) held for the person's confirmation. */
  confirmActions: string[];
}

/** One identity, or undefined. */
export async function findIdentity(db: IamDb, identityId: string): Promise<IdentityRow | undefined> {
  return db.selectFrom('iam.identities').selectAll().where('id', '=', identityId).executeTakeFirst();
}

/**
 * Inserts an identity and, for an agent acting for a person, its delegation, in the caller's
 * transaction. CONFLICT when the tenant already has an identity of that name; NOT_FOUND when the
 * tenant or the person does not exist.
 */
export async function insertIdentity(
  trx: IamTransaction,
  identity: { id: string; tenantId: string; kind: IdentityKind; name: string; email: string | null },
  delegation: { id: string; personIdentityId: string; confirmActions: string[] } | null,
): Promise<void> {
  const write = async () => {
    await trx
      .insertInto('iam.identities')
      .values({
        id: identity.id,
        tenant_id: identity.tenantId,
        kind: identity.kind,
        name: identity.name,
        email: identity.email,
      })
      .execute();
    if (delegation) {
      await trx
        .insertInto('iam.delegations')
        .values({
          id: delegation.id,
          agent_identity_id: identity.id,
          person_identity_id: delegation.personIdentityId,
          confirm_actions: delegation.confirmActions,
        })
        .execute();
    }
  };
  await conflictOnDuplicate(
    () =>
      notFoundOnMissingReference(write, {
        tenant_id: `tenantId: tenant ${identity.tenantId} does not exist`,
        person_identity_id: `personIdentityId: identity ${delegation?.personIdentityId} does not exist`,
      }),
    `tenant ${identity.tenantId} already has an identity named ${identity.name}`,
  );
}

/** A tenant's identities, oldest first, each with its standing delegation if it is an agent. */
export async function listIdentities(db: IamDb, tenantId: string): Promise<IdentityInfo[]> {
  const rows = await db
    .selectFrom('iam.identities as i')
    .leftJoin('iam.delegations as d', (j) =>
      j.onRef('d.agent_identity_id', '=', 'i.id').on('d.revoked_at', 'is', null),
    )
    .where('i.tenant_id', '=', tenantId)
    .select(['i.id', 'i.tenant_id', 'i.kind', 'i.name', 'i.email', 'i.created_at', 'd.id as delegation_id'])
    .orderBy('i.created_at')
    .execute();
  return rows.map((r) => ({
    id: r.id,
    tenantId: r.tenant_id,
    kind: r.kind,
    name: r.name,
    email: r.email,
    delegationId: r.delegation_id,
    createdAt: r.created_at,
  }));
}

/** A delegation that is not revoked, or null. */
export async function findActiveDelegation(
  db: IamDb,
  delegationId: string,
): Promise<ActiveDelegation | null> {
  const row = await db
    .selectFrom('iam.delegations')
    .select(['id', 'person_identity_id', 'confirm_actions'])
    .where('id', '=', delegationId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return row
    ? { id: row.id, personIdentityId: row.person_identity_id, confirmActions: row.confirm_actions }
    : null;
}

/**
 * An agent's delegation from its person: the standing one, else the most recently revoked one (an
 * agent made to act for a person never acts on its own); null for an agent that never had one.
 */
export async function findAgentDelegation(
  db: IamDb,
  agentIdentityId: string,
): Promise<{ id: string; revoked: boolean } | null> {
  const row = await db
    .selectFrom('iam.delegations')
    .select(['id', 'revoked_at'])
    .where('agent_identity_id', '=', agentIdentityId)
    .orderBy(sql`revoked_at IS NULL`, 'desc')
    .orderBy('revoked_at', 'desc')
    .limit(1)
    .executeTakeFirst();
  return row ? { id: row.id, revoked: row.revoked_at !== null } : null;
}

/**
 * Revokes a delegation at `compute_now()`; idempotent (keeps the first revocation). From then on
 * the agent's tokens under it no longer authenticate. Undefined when it does not exist.
 */
export async function revokeDelegation(
  db: IamDb,
  delegationId: string,
): Promise<{ id: string; agentIdentityId: string; revokedAt: Date } | undefined> {
  const row = await db
    .updateTable('iam.delegations')
    .set({ revoked_at: sql<Date>`COALESCE(revoked_at, compute_now())` })
    .where('id', '=', delegationId)
    .returning(['id', 'agent_identity_id', 'revoked_at'])
    .executeTakeFirst();
  return row?.revoked_at
    ? { id: row.id, agentIdentityId: row.agent_identity_id, revokedAt: row.revoked_at }
    : undefined;
}
