import { type Kysely, sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import type {
  BillingCheck,
  Confirmation,
  Decision,
  DecisionContext,
  IamPort,
  Principal,
  ResourceRef,
  UsageRecord,
} from '../../core/iam-port.ts';
import type { Logger } from '../../core/logger.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { createIamAdmin, hashToken, type IamAdmin } from './admin.ts';
import { type DelegationRow, decide, latestConfirmation, maxConfirmationMs } from './decide.ts';
import { createDirectory } from './directory.ts';
import { actionMatches } from './policy.ts';
import type { IamDatabase } from './schema.ts';

export type { IamAdmin } from './admin.ts';
export type { Condition, PolicyDocument } from './policy.ts';

/** The IamPort plus IAM's own administration (tenants, identities, tokens, roles, policies, …). */
export interface EmbeddedIam extends IamPort {
  admin: IamAdmin;
  /** Drops every cached directory read (tests and admin writes from another process). */
  invalidate(): void;
}

/**
 * The embedded IAM over the same PostgreSQL, in its own schema `iam`. Decisions read a directory
 * cache (2 s, dropped by every admin write in this process); authentication hits the database and
 * is cached 30 s by the API's authenticator.
 */
export function createEmbeddedIam(deps: { db: Db; log: Logger; confirmationTtlMs?: number }): EmbeddedIam {
  const db = deps.db as unknown as Kysely<IamDatabase>;
  const log = deps.log.child({ component: 'iam' });
  const directory = createDirectory(db);
  const admin = createIamAdmin(db, directory);
  const confirmationTtlMs = Math.min(deps.confirmationTtlMs ?? maxConfirmationMs, maxConfirmationMs);
  const delegations = new Map<string, { at: number; row: DelegationRow | null }>();

  async function delegationOf(principal: Principal): Promise<DelegationRow | null> {
    if (principal.sessionKind !== 'delegated' || !principal.delegation) return null;
    const id = principal.delegation.delegationId;
    const hit = delegations.get(id);
    if (hit && Date.now() - hit.at < 2_000) return hit.row;
    const row = await db
      .selectFrom('iam.delegations')
      .select(['id', 'person_identity_id', 'confirm_actions'])
      .where('id', '=', id)
      .where('revoked_at', 'is', null)
      .executeTakeFirst();
    const value = row
      ? { id: row.id, personIdentityId: row.person_identity_id, confirmActions: row.confirm_actions }
      : null;
    delegations.set(id, { at: Date.now(), row: value });
    return value;
  }

  async function authorize(
    principal: Principal,
    action: string,
    resource: ResourceRef,
  ): Promise<Decision & { held?: boolean }> {
    return decide(db, directory, principal, action, resource, await delegationOf(principal));
  }

  async function requestConfirmation(
    principal: Principal,
    action: string,
    resource: ResourceRef,
  ): Promise<Confirmation | null> {
    const delegation = await delegationOf(principal);
    if (!delegation?.confirmActions.some((a) => actionMatches(a, action))) return null;
    const open = await latestConfirmation(db, principal.identityId, action, resource);
    if (open && open.state === 'pending') return open;
    const id = newId('cnf');
    const row = await db
      .insertInto('iam.confirmations')
      .values({
        id,
        tenant_id: resource.tenantId,
        delegation_id: delegation.id,
        agent_identity_id: principal.identityId,
        person_identity_id: delegation.personIdentityId,
        action,
        resource_type: resource.type,
        resource_id: resource.id,
        expires_at: sql<Date>`compute_now() + make_interval(secs => ${confirmationTtlMs / 1000})` as never,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    log.info({ confirmationId: id, action, resourceId: resource.id }, 'confirmation requested');
    return {
      id,
      state: 'pending',
      action,
      resource: { type: resource.type, id: resource.id },
      agentIdentityId: principal.identityId,
      personIdentityId: delegation.personIdentityId,
      expiresAt: row.expires_at,
    };
  }

  const iam: EmbeddedIam = {
    admin,
    invalidate: () => {
      directory.invalidate();
      delegations.clear();
    },

    async authenticate({ token }) {
      const row = await db
        .selectFrom('iam.tokens as t')
        .innerJoin('iam.identities as i', 'i.id', 't.identity_id')
        .leftJoin('iam.delegations as d', (j) =>
          j.onRef('d.id', '=', 't.delegation_id').on('d.revoked_at', 'is', null),
        )
        .where('t.secret_hash', '=', hashToken(token))
        .where('t.revoked_at', 'is', null)
        .where('i.disabled_at', 'is', null)
        .where(sql<boolean>`(t.expires_at IS NULL OR t.expires_at > compute_now())`)
        .select([
          't.id as token_id',
          't.last_used_at',
          'i.id as identity_id',
          'i.tenant_id',
          'i.kind',
          'd.id as delegation_id',
          'd.person_identity_id',
        ])
        .executeTakeFirst();
      if (!row) {
        throw new ComputeError(
          'UNAUTHENTICATED',
          'the API token is unknown, revoked or expired: create a new one',
        );
      }
      await db
        .updateTable('iam.tokens')
        .set({ last_used_at: sql<Date>`compute_now()` as never })
        .where('id', '=', row.token_id)
        .where(sql<boolean>`(last_used_at IS NULL OR last_used_at < compute_now() - interval '60 seconds')`)
        .execute();
      const root = await directory.rootTenantId();
      const roles = row.tenant_id === root ? await directory.roles(row.identity_id) : [];
      const rootAdmin = roles.some(
        (r) => r.tenantId === root && r.actions.some((a) => actionMatches(a, 'compute:admin:write')),
      );
      return {
        identityId: row.identity_id,
        tenantId: row.tenant_id,
        kind: row.kind,
        tokenId: row.token_id,
        sessionKind: row.delegation_id ? 'delegated' : 'direct',
        ...(row.delegation_id
          ? { delegation: { delegationId: row.delegation_id, personIdentityId: row.person_identity_id! } }
          : {}),
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
      const budgets = await db
        .selectFrom('iam.budgets')
        .select(['meter', 'limit_amount'])
        .where('tenant_id', '=', tenantId)
        .where('meter', 'in', meter ? [meter, '*'] : ['*'])
        .execute();
      if (budgets.length === 0) return { allowed: true };
      let remaining = Number.POSITIVE_INFINITY;
      for (const budget of budgets) {
        const { rows } = await sql<{ spent: string }>`
          SELECT COALESCE(sum(quantity), 0) AS spent FROM iam.usage_records
          WHERE tenant_id = ${tenantId} AND (${budget.meter} = '*' OR meter = ${budget.meter})
            AND window_start >= date_trunc('month', compute_now())`.execute(db);
        remaining = Math.min(remaining, Number(budget.limit_amount) - Number(rows[0]!.spent));
      }
      return remaining > 0
        ? { allowed: true, remaining }
        : {
            allowed: false,
            remaining: Math.max(0, remaining),
            reason: `the budget of tenant ${tenantId} is spent`,
          };
    },

    async recordUsage(records: readonly UsageRecord[]) {
      if (records.length === 0) return;
      await db
        .insertInto('iam.usage_records')
        .values(
          records.map((r) => ({
            idempotency_key: r.idempotencyKey,
            tenant_id: r.tenantId,
            meter: r.meter,
            quantity: r.quantity,
            window_start: r.windowStart,
            window_end: r.windowEnd,
            subject: r.subject,
          })),
        )
        .onConflict((oc) => oc.column('idempotency_key').doNothing())
        .execute();
    },

    async featureEnabled(tenantId, feature) {
      const chain = await directory.chain(tenantId);
      for (const tenant of chain) {
        const row = await db
          .selectFrom('iam.feature_flags')
          .select('enabled')
          .where('tenant_id', '=', tenant.id)
          .where('feature', '=', feature)
          .executeTakeFirst();
        if (row) return row.enabled;
      }
      return false;
    },
  };
  return iam;
}
