import { sql } from 'kysely';
import type { Confirmation, Decision, Principal, ResourceRef } from '../../core/iam-port.ts';
import type { Directory, IamDb } from './directory.ts';
import { actionMatches, evaluateCondition, statementApplies } from './policy.ts';

/** The longest a delegated confirmation may stay open. */
export const maxConfirmationMs = 30 * 60_000;

export interface DelegationRow {
  id: string;
  personIdentityId: string;
  confirmActions: string[];
}

function rolesGrant(
  roles: Awaited<ReturnType<Directory['roles']>>,
  action: string,
  tenantChain: ReadonlySet<string>,
) {
  return roles.some((r) => tenantChain.has(r.tenantId) && r.actions.some((a) => actionMatches(a, action)));
}

/**
 * Decides one action on one resource: the caller's tenant must be the resource's tenant or one of
 * its ancestors; roles bound on the resource's tenant or above grant actions; policies of the
 * resource's tenant and its ancestors add allows and denies; deny wins; deny by default. An agent
 * in a delegated session needs the action granted to itself and to its person, and an action its
 * delegation holds for confirmation needs the person's approval for this very resource.
 */
export async function decide(
  db: IamDb,
  directory: Directory,
  principal: Principal,
  action: string,
  resource: ResourceRef,
  delegation: DelegationRow | null,
): Promise<Decision & { held?: boolean }> {
  const chain = await directory.chain(resource.tenantId);
  if (chain.length === 0) {
    return { allowed: false, reason: `tenant ${resource.tenantId} does not exist`, policyIds: [] };
  }
  const chainIds = new Set(chain.map((t) => t.id));
  if (!chainIds.has(principal.tenantId)) {
    return {
      allowed: false,
      reason: `identity ${principal.identityId} of tenant ${principal.tenantId} cannot act in tenant ${resource.tenantId}`,
      policyIds: [],
    };
  }
  let granted = rolesGrant(await directory.roles(principal.identityId), action, chainIds);
  const policyIds: string[] = [];
  const input = {
    attributes: resource.attributes ?? {},
    resource: {
      id: resource.id,
      type: resource.type,
      tenantId: resource.tenantId,
      ownerIdentityId: resource.ownerIdentityId ?? undefined,
      parentId: resource.parent?.id,
      parentType: resource.parent?.type,
      isOwner: resource.ownerIdentityId ? resource.ownerIdentityId === principal.identityId : undefined,
    },
    principal: {
      identityId: principal.identityId,
      tenantId: principal.tenantId,
      kind: principal.kind,
      sessionKind: principal.sessionKind,
    },
  };
  for (const tenant of chain) {
    for (const policy of await directory.policies(tenant.id)) {
      for (const statement of policy.document.statements) {
        if (!statementApplies(statement, action, resource.type, principal)) continue;
        if (statement.condition && !evaluateCondition(statement.condition, input)) continue;
        if (statement.effect === 'deny') {
          return {
            allowed: false,
            reason: `denied by policy ${policy.name} v${policy.version}${statement.sid ? ` (${statement.sid})` : ''}`,
            policyIds: [policy.id],
          };
        }
        granted = true;
        policyIds.push(policy.id);
      }
    }
  }
  if (!granted) {
    return {
      allowed: false,
      reason: `no role or policy grants ${action} to ${principal.identityId}`,
      policyIds,
    };
  }
  if (principal.sessionKind === 'delegated' && delegation) {
    const personGranted = rolesGrant(await directory.roles(delegation.personIdentityId), action, chainIds);
    if (!personGranted) {
      return {
        allowed: false,
        reason: `the person ${delegation.personIdentityId} this agent acts for does not hold ${action}`,
        policyIds,
      };
    }
    if (delegation.confirmActions.some((a) => actionMatches(a, action))) {
      const confirmation = await latestConfirmation(db, principal.identityId, action, resource);
      if (confirmation?.state === 'approved' && confirmation.expiresAt > (await dbNow(db))) {
        return { allowed: true, policyIds };
      }
      return {
        allowed: false,
        reason:
          confirmation?.state === 'denied'
            ? `${delegation.personIdentityId} denied ${action} on ${resource.id}`
            : `${action} needs the confirmation of ${delegation.personIdentityId}`,
        policyIds,
        ...(confirmation ? { confirmation } : {}),
        held: confirmation?.state !== 'denied',
      };
    }
  }
  return { allowed: true, policyIds };
}

export async function dbNow(db: IamDb): Promise<Date> {
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(db);
  return rows[0]!.now;
}

export async function latestConfirmation(
  db: IamDb,
  agentIdentityId: string,
  action: string,
  resource: { type: string; id: string },
): Promise<Confirmation | null> {
  const row = await db
    .selectFrom('iam.confirmations')
    .selectAll()
    .where('agent_identity_id', '=', agentIdentityId)
    .where('action', '=', action)
    .where('resource_type', '=', resource.type)
    .where('resource_id', '=', resource.id)
    .orderBy('created_at', 'desc')
    .limit(1)
    .executeTakeFirst();
  if (!row) return null;
  return {
    id: row.id,
    state: row.state === 'pending' && row.expires_at <= (await dbNow(db)) ? 'expired' : row.state,
    action: row.action,
    resource: { type: row.resource_type, id: row.resource_id },
    agentIdentityId: row.agent_identity_id,
    personIdentityId: row.person_identity_id,
    expiresAt: row.expires_at,
  };
}
