import type { Db } from '../../core/database.ts';
import type {
  BillingCheck,
  Confirmation,
  DecisionContext,
  IamAdminPort,
  IamPort,
  Principal,
  ResourceRef,
  UsageRecord,
} from '../../core/iam-port.ts';
import type { Logger } from '../../core/logger.ts';
import { insertUsageRecords, selectBudgets, usageThisMonth } from '../../db/iam/budgets.ts';
import { findLatestConfirmation, insertConfirmation, useApproval } from '../../db/iam/confirmations.ts';
import { findFeatureFlag } from '../../db/iam/features.ts';
import { iamDatabase } from '../../db/iam/iam-db.ts';
import type { ActiveDelegation } from '../../db/iam/identities.ts';
import { findTokenHolder, touchTokenLastUsed } from '../../db/iam/tokens.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import { newId } from '../../domain/ids.ts';
import { createIamAdmin, hashToken } from './admin.ts';
import { decide, type EmbeddedDecision, maxConfirmationMs } from './decide.ts';
import { createDirectory } from './directory.ts';
import { actionMatches } from './policy.ts';

/** The IamPort with its administration always present, plus a way to drop its caches. */
export interface EmbeddedIam extends IamPort {
  readonly admin: IamAdminPort;
  /** Drops every cached directory read (tests and admin writes from another process). */
  invalidate(): void;
}

/**
 * The embedded IAM over the same PostgreSQL, in its own schema `iam`. Decisions read a directory
 * cache (2 s, dropped by every admin write in this process); authentication hits the database and
 * is cached 30 s by the API's authenticator.
 */
export function createEmbeddedIam(deps: { db: Db; log: Logger; confirmationTtlMs?: number }): EmbeddedIam {
  const db = iamDatabase(deps.db);
  const log = deps.log.child({ component: 'iam' });
  const directory = createDirectory(db);
  const admin = createIamAdmin(db, directory);
  const confirmationTtlMs = Math.min(deps.confirmationTtlMs ?? maxConfirmationMs, maxConfirmationMs);

  /**
   * The standing delegation of a delegated session (null for a direct one). A session whose
   * delegation was revoked is UNAUTHENTICATED: it never falls back to the agent acting on its own.
   */
  async function delegationOf(principal: Principal): Promise<ActiveDelegation | null> {
    if (principal.sessionKind !== 'delegated') return null;
    const row = principal.delegation ? await directory.delegation(principal.delegation.delegationId) : null;
    if (!row) {
      throw new ComputeError(
        'UNAUTHENTICATED',
        'the delegation this agent acts under was revoked: its tokens no longer authenticate; ask the person it acted for for a new agent',
      );
    }
    return row;
  }

  async function authorize(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<EmbeddedDecision> {
    const delegation = await delegationOf(principal);
    return decide(db, directory, principal, action, resource, delegation, context?.requestHash ?? null);
  }

  async function requestConfirmation(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<Confirmation | null> {
    const delegation = await delegationOf(principal);
    if (!delegation?.confirmActions.some((a) => actionMatches(a, action))) return null;
    const requestHash = context?.requestHash ?? null;
    const open = (await findLatestConfirmation(db, principal.identityId, action, resource, requestHash))
      ?.confirmation;
    if (open && open.state === 'pending') return open;
    const confirmation = await insertConfirmation(db, {
      id: newId('cnf'),
      tenantId: resource.tenantId,
      delegationId: delegation.id,
      agentIdentityId: principal.identityId,
      personIdentityId: delegation.personIdentityId,
      action,
      resource,
      requestHash,
      ttlMs: confirmationTtlMs,
    });
    log.info({ confirmationId: confirmation.id, action, resourceId: resource.id }, 'confirmation requested');
    return confirmation;
  }

  const iam: EmbeddedIam = {
    admin,
    invalidate: () => directory.invalidate(),

    async authenticate({ token }) {
      const holder = await findTokenHolder(db, hashToken(token));
      if (!holder) {
        throw new ComputeError(
          'UNAUTHENTICATED',
          'the API token is unknown, revoked or expired: create a new one',
        );
      }
      await touchTokenLastUsed(db, holder.tokenId);
      const root = await directory.rootTenantId();
      const roles = holder.tenantId === root ? await directory.roles(holder.identityId) : [];
      const rootAdmin = roles.some(
        (r) => r.tenantId === root && r.actions.some((a) => actionMatches(a, 'compute:admin:write')),
      );
      return {
        identityId: holder.identityId,
        tenantId: holder.tenantId,
        kind: holder.kind,
        tokenId: holder.tokenId,
        sessionKind: holder.delegation ? 'delegated' : 'direct',
        ...(holder.delegation ? { delegation: holder.delegation } : {}),
        rootAdmin,
      };
    },

    /** The decision alone: an approval that allows it is not used up (require does that). */
    async authorize(principal, action, resource, context) {
      const {
        held: _held,
        approvalId: _approval,
        visiblePolicyIds: _visible,
        ...decision
      } = await authorize(principal, action, resource, context);
      return decision;
    },

    async authorizeMany(principal, checks) {
      return Promise.all(checks.map((c) => iam.authorize(principal, c.action, c.resource)));
    },

    async require(principal, action, resource, context) {
      let decision = await authorize(principal, action, resource, context);
      // An approval admits one decision: a concurrent one that used it first leaves this one held.
      if (decision.allowed && decision.approvalId && !(await useApproval(db, decision.approvalId))) {
        decision = await authorize(principal, action, resource, context);
        if (decision.allowed && decision.approvalId) {
          decision = {
            allowed: false,
            reason: 'its approval was used by another request at the same time',
            policyIds: decision.policyIds,
            held: true,
          };
        }
      }
      if (decision.allowed) {
        if (decision.approvalId) {
          log.info({ confirmationId: decision.approvalId, action, resourceId: resource.id }, 'approval used');
        }
        return;
      }
      const confirmation = !decision.held
        ? null
        : decision.confirmation?.state === 'pending'
          ? decision.confirmation
          : await requestConfirmation(principal, action, resource, context);
      if (confirmation && confirmation.state === 'pending') {
        throw new ComputeError(
          'CONFIRMATION_REQUIRED',
          `${action} on ${resource.id} waits for ${confirmation.personIdentityId} to approve confirmation ${confirmation.id}; retry with the same idempotency key once approved`,
          { confirmationId: confirmation.id, expiresAt: confirmation.expiresAt.getTime() },
        );
      }
      log.debug(
        { action, resourceId: resource.id, reason: decision.reason, requestId: context?.requestId },
        'denied',
      );
      throw new ComputeError(
        'ACCESS_DENIED',
        `${action} on ${resource.type} ${resource.id} is denied: ${decision.reason}`,
        {
          action,
          resourceType: resource.type,
          ...(decision.visiblePolicyIds?.length ? { policyIds: decision.visiblePolicyIds } : {}),
        },
      );
    },

    requestConfirmation,

    async billingCheck(tenantId, meter): Promise<BillingCheck> {
      const budgets = await selectBudgets(db, tenantId, meter);
      if (budgets.length === 0) return { allowed: true };
      let remaining = Number.POSITIVE_INFINITY;
      for (const budget of budgets) {
        remaining = Math.min(remaining, budget.limit - (await usageThisMonth(db, tenantId, budget.meter)));
      }
      return remaining > 0
        ? { allowed: true, remaining }
        : {
            allowed: false,
            remaining: Math.max(0, remaining),
            reason: `the budget of tenant ${tenantId} is spent`,
          };
    },

    recordUsage: (records: readonly UsageRecord[]) => insertUsageRecords(db, records),

    async featureEnabled(tenantId, feature) {
      for (const tenant of await directory.chain(tenantId)) {
        const enabled = await findFeatureFlag(db, tenant.id, feature);
        if (enabled !== undefined) return enabled;
      }
      return false;
    },
  };
  return iam;
}
