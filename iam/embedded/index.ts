import type { Db } from '../../core/database.ts';
import type {
  BillingCheck,
  Confirmation,
  Decision,
  DecisionContext,
  IamAdminPort,
  IamPort,
  Principal,
  ResourceRef,
  UsageRecord,
} from '../../core/iam-port.ts';
import type { Logger } from '../../core/logger.ts';
import { insertUsageRecords, selectBudgets, usageThisMonth } from '../../db/iam/budgets.ts';
import { findLatestConfirmation, insertConfirmation } from '../../db/iam/confirmations.ts';
import { findFeatureFlag } from '../../db/iam/features.ts';
import { iamDatabase } from '../../db/iam/iam-db.ts';
import { type ActiveDelegation, findActiveDelegation } from '../../db/iam/identities.ts';
import { findTokenHolder, touchTokenLastUsed } from '../../db/iam/tokens.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import { newId } from '../../domain/ids.ts';
import { createIamAdmin, hashToken } from './admin.ts';
import { decide, maxConfirmationMs } from './decide.ts';
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
  const delegations = new Map<string, { at: number; row: ActiveDelegation | null }>();

  async function delegationOf(principal: Principal): Promise<ActiveDelegation | null> {
    if (principal.sessionKind !== 'delegated' || !principal.delegation) return null;
    const id = principal.delegation.delegationId;
    const hit = delegations.get(id);
    if (hit && Date.now() - hit.at < 2_000) return hit.row; // wall time: the cache's TTL
    const row = await findActiveDelegation(db, id);
    delegations.set(id, { at: Date.now(), row }); // wall time: the cache's TTL
    return row;
  }

  async function authorize(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
  ): Promise<Decision & { held?: boolean }> {
    return decide(db, directory, principal, action, resource, await delegationOf(principal));
  }

  async function requestConfirmation(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
  ): Promise<Confirmation | null> {
    const delegation = await delegationOf(principal);
    if (!delegation?.confirmActions.some((a) => actionMatches(a, action))) return null;
    const open = (await findLatestConfirmation(db, principal.identityId, action, resource))?.confirmation;
    if (open && open.state === 'pending') return open;
    const confirmation = await insertConfirmation(db, {
      id: newId('cnf'),
      tenantId: resource.tenantId,
      delegationId: delegation.id,
      agentIdentityId: principal.identityId,
      personIdentityId: delegation.personIdentityId,
      action,
      resource,
      ttlMs: confirmationTtlMs,
    });
    log.info({ confirmationId: confirmation.id, action, resourceId: resource.id }, 'confirmation requested');
    return confirmation;
  }

  const iam: EmbeddedIam = {
    admin,
    invalidate: () => {
      directory.invalidate();
      delegations.clear();
    },

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

    async authorize(principal, action, resource, _context?: DecisionContext) {
      const { held: _held, ...decision } = await authorize(principal, action, resource);
      return decision;
    },

    async authorizeMany(principal, checks) {
      return Promise.all(checks.map((c) => authorize(principal, c.action, c.resource)));
    },

    async require(principal, action, resource, context) {
      const decision = await authorize(principal, action, resource);
      if (decision.allowed) return;
      const confirmation = !decision.held
        ? null
        : decision.confirmation?.state === 'pending'
          ? decision.confirmation
          : await requestConfirmation(principal, action, resource);
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
          ...(decision.policyIds.length ? { policyIds: decision.policyIds } : {}),
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
