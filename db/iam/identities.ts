import type { Selectable } from 'kysely';
import type { IamDb, IamIdentitiesTable, IamTransaction } from '../../core/iam-database.ts';
import type { IdentityInfo, IdentityKind } from '../../core/iam-port.ts';
import { conflictOnDuplicate } from './iam-db.ts';

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
 * transaction. CONFLICT when the tenant already has an identity of that name.
 */
export async function insertIdentity(
  trx: IamTransaction,
  identity: { id: string; tenantId: string; kind: IdentityKind; name: string; email: string | null },
  delegation: { id: string; personIdentityId: string; confirmActions: string[] } | null,
): Promise<void> {
  await conflictOnDuplicate(async () => {
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
  }, `tenant ${identity.tenantId} already has an identity named ${identity.name}`);
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

/** The id of an agent's standing (not revoked) delegation, or null. */
export async function findAgentDelegationId(db: IamDb, agentIdentityId: string): Promise<string | null> {
  const row = await db
    .selectFrom('iam.delegations')
    .select('id')
    .where('agent_identity_id', '=', agentIdentityId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return row?.id ?? null;
}
