import type { IamDb } from '../../core/iam-database.ts';
import type { Decision, Principal, ResourceRef } from '../../core/iam-port.ts';
import { findLatestConfirmation } from '../../db/iam/confirmations.ts';
import type { ActiveDelegation } from '../../db/iam/identities.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import type { Directory } from './directory.ts';
import { actionMatches, evaluateCondition, statementApplies } from './policy.ts';

/** The longest a delegated confirmation may stay open. */
export const maxConfirmationMs = 30 * 60_000;

function rolesGrant(
  roles: Awaited<ReturnType<Directory['roles']>>,
  action: IamAction,
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
  action: IamAction,
  resource: ResourceRef,
  delegation: ActiveDelegation | null,
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
      const latest = await findLatestConfirmation(db, principal.identityId, action, resource);
      const confirmation = latest?.confirmation;
      if (confirmation?.state === 'approved' && !latest?.lapsed) {
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
