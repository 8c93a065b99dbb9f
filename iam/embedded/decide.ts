import type { IamDb } from '../../core/iam-database.ts';
import type { Decision, Principal, ResourceRef } from '../../core/iam-port.ts';
import { findLatestConfirmation } from '../../db/iam/confirmations.ts';
import type { ActiveDelegation } from '../../db/iam/identities.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import type { Directory } from './directory.ts';
import { actionMatches, evaluateCondition, statementApplies } from './policy.ts';

/** The longest a delegated confirmation may stay open. */
export const maxConfirmationMs = 30 * 60_000;

/** What decide answers beyond the port's Decision: what require needs to act on it. */
export type EmbeddedDecision = Decision & {
  /** Refused only until the delegating person approves (a confirmation is, or can be, open). */
  held?: boolean;
  /** The approval that allows this decision: require uses it up before it admits. */
  approvalId?: string;
  /** The policies the caller may be told about (its own tenant's, or every one for a root admin). */
  visiblePolicyIds?: string[];
};

function rolesGrant(
  roles: Awaited<ReturnType<Directory['roles']>>,
  action: IamAction,
  tenantChain: ReadonlySet<string>,
) {
  return roles.some((r) => tenantChain.has(r.tenantId) && r.actions.some((a) => actionMatches(a, action)));
}

/**
 * What to ask for when no role grants `action`: the built-in roles that do, narrowest first (a
 * role granting every action comes last).
 */
async function rolesToAskFor(directory: Directory, action: IamAction): Promise<string> {
  const broad = (actions: string[]) => actions.some((a) => a === '*' || a === 'compute:*');
  const granting = (await directory.builtInRoles())
    .filter((r) => r.actions.some((a) => actionMatches(a, action)))
    .sort((a, b) => Number(broad(a.actions)) - Number(broad(b.actions)))
    .map((r) => r.name);
  return granting.length > 0 ? ` (built-in: ${granting.join(' or ')})` : '';
}

/**
 * Decides one action on one resource: the caller's tenant must be the resource's tenant or one of
 * its ancestors; roles bound on the resource's tenant or above grant actions; policies of the
 * resource's tenant and its ancestors add allows and denies; deny wins; deny by default. An agent
 * in a delegated session needs the action granted to itself and to its person, and an action its
 * delegation holds for confirmation needs the person's approval of this very request
 * (`requestHash`) on this very resource, unused. A refusal's reason says what to ask whom for, and
 * names only the caller's own tenant's policies (any for a root admin), never another tenant's
 * policies or identities. Reads only; using an approval up is require's step.
 */
export async function decide(
  db: IamDb,
  directory: Directory,
  principal: Principal,
  action: IamAction,
  resource: ResourceRef,
  delegation: ActiveDelegation | null,
  requestHash: string | null = null,
): Promise<EmbeddedDecision> {
  const chain = await directory.chain(resource.tenantId);
  if (chain.length === 0) {
    return { allowed: false, reason: `tenant ${resource.tenantId} does not exist`, policyIds: [] };
  }
  const chainIds = new Set(chain.map((t) => t.id));
  if (!chainIds.has(principal.tenantId)) {
    return {
      allowed: false,
      reason: `your tenant ${principal.tenantId} is neither tenant ${resource.tenantId} nor above it`,
      policyIds: [],
    };
  }
  let granted = rolesGrant(await directory.roles(principal.identityId), action, chainIds);
  const policyIds: string[] = [];
  const visiblePolicyIds: string[] = [];
  const visible = (policy: { tenantId: string }) =>
    principal.rootAdmin || policy.tenantId === principal.tenantId;
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
            reason: visible(policy)
              ? `denied by policy ${policy.name} v${policy.version}${statement.sid ? ` (${statement.sid})` : ''} of tenant ${policy.tenantId}; ask an administrator of tenant ${policy.tenantId} if it should allow this`
              : `denied by a policy set outside your tenant; ask an administrator of tenant ${principal.tenantId}`,
            policyIds: [policy.id],
            visiblePolicyIds: visible(policy) ? [policy.id] : [],
          };
        }
        granted = true;
        policyIds.push(policy.id);
        if (visible(policy)) visiblePolicyIds.push(policy.id);
      }
    }
  }
  if (!granted) {
    return {
      allowed: false,
      reason: `no role bound to you on tenant ${resource.tenantId} grants it and no policy allows it; ask an administrator of tenant ${resource.tenantId} for a role that grants ${action}${await rolesToAskFor(directory, action)}`,
      policyIds,
      visiblePolicyIds,
    };
  }
  if (principal.sessionKind === 'delegated' && delegation) {
    const personGranted = rolesGrant(await directory.roles(delegation.personIdentityId), action, chainIds);
    if (!personGranted) {
      return {
        allowed: false,
        reason: `the person ${delegation.personIdentityId} you act for holds no role granting ${action}; ask an administrator of tenant ${resource.tenantId} to grant them one${await rolesToAskFor(directory, action)}`,
        policyIds,
        visiblePolicyIds,
      };
    }
    if (delegation.confirmActions.some((a) => actionMatches(a, action))) {
      const latest = await findLatestConfirmation(db, principal.identityId, action, resource, requestHash);
      const confirmation = latest?.confirmation;
      if (confirmation?.state === 'approved' && !latest?.lapsed && !latest?.used) {
        return { allowed: true, policyIds, approvalId: confirmation.id };
      }
      return {
        allowed: false,
        reason:
          confirmation?.state === 'denied'
            ? `${delegation.personIdentityId} denied it`
            : `it needs the confirmation of ${delegation.personIdentityId} (an approval admits one request, once)`,
        policyIds,
        visiblePolicyIds,
        ...(confirmation ? { confirmation } : {}),
        held: confirmation?.state !== 'denied',
      };
    }
  }
  return { allowed: true, policyIds };
}
