import { sql } from 'kysely';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type { Directory, IamDb } from './directory.ts';
import { createLookups } from './lookups.ts';
import { type PolicyDocument, policyDocumentSchema } from './policy.ts';

function isUniqueViolation(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: string }).code === '23505';
}

/**
 * IAM's access administration: roles and their bindings, versioned policies, the person's answer
 * to a confirmation, budgets and feature flags. Every write drops the decision cache.
 */
export function createAccessAdmin(db: IamDb, directory: Directory) {
  const { requireTenant, requireIdentity } = createLookups(db, directory);

  return {
    async createRole(input: { tenantId: string; name: string; actions: string[] }) {
      await requireTenant(input.tenantId);
      const id = newId('role');
      try {
        await db
          .insertInto('iam.roles')
          .values({ id, tenant_id: input.tenantId, name: input.name, actions: input.actions })
          .execute();
      } catch (error) {
        if (isUniqueViolation(error)) {
          throw new ComputeError(
            'CONFLICT',
            `tenant ${input.tenantId} already has a role named ${input.name}`,
          );
        }
        throw error;
      }
      directory.invalidate();
      return { id, tenantId: input.tenantId, name: input.name, actions: input.actions };
    },

    async listRoles(tenantId?: string) {
      const rows = await db
        .selectFrom('iam.roles')
        .selectAll()
        .where((eb) =>
          tenantId ? eb.or([eb('tenant_id', 'is', null), eb('tenant_id', '=', tenantId)]) : eb.val(true),
        )
        .orderBy('created_at')
        .execute();
      return rows.map((r) => ({ id: r.id, tenantId: r.tenant_id, name: r.name, actions: r.actions }));
    },

    /** Binds a role (by id, or by name: the tenant's own first, then a built-in) on a tenant. */
    async bindRole(input: { identityId: string; role: string; tenantId?: string }) {
      const identity = await requireIdentity(input.identityId);
      const tenantId = input.tenantId ?? identity.tenant_id;
      await requireTenant(tenantId);
      const role = await db
        .selectFrom('iam.roles')
        .selectAll()
        .where((eb) =>
          eb.or([
            eb('id', '=', input.role),
            eb.and([
              eb('name', '=', input.role),
              eb.or([eb('tenant_id', '=', tenantId), eb('tenant_id', 'is', null)]),
            ]),
          ]),
        )
        .orderBy(sql`tenant_id IS NULL`)
        .executeTakeFirst();
      if (!role)
        throw new ComputeError('NOT_FOUND', `role ${input.role} does not exist for tenant ${tenantId}`);
      await db
        .insertInto('iam.role_bindings')
        .values({ identity_id: identity.id, role_id: role.id, tenant_id: tenantId })
        .onConflict((oc) => oc.doNothing())
        .execute();
      directory.invalidate();
      return { identityId: identity.id, roleId: role.id, roleName: role.name, tenantId };
    },

    /** Applies a policy document under `name`: a new version, which is in force from now on. */
    async applyPolicy(input: { tenantId: string; name: string; document: unknown; createdBy?: string }) {
      await requireTenant(input.tenantId);
      const parsed = policyDocumentSchema.safeParse(input.document);
      if (!parsed.success) {
        const issue = parsed.error.issues[0]!;
        throw new ComputeError('INVALID_INPUT', `document.${issue.path.join('.')}: ${issue.message}`, {
          issues: parsed.error.issues.map((i) => ({
            field: `document.${i.path.join('.')}`,
            message: i.message,
          })),
        });
      }
      const document: PolicyDocument = parsed.data;
      const id = newId('pol');
      const row = await db
        .insertInto('iam.policies')
        .values({
          id,
          tenant_id: input.tenantId,
          name: input.name,
          version: sql<number>`(SELECT COALESCE(max(version), 0) + 1 FROM iam.policies
                                WHERE tenant_id = ${input.tenantId} AND name = ${input.name})` as never,
          document: JSON.stringify(document),
          created_by: input.createdBy ?? null,
        })
        .returning(['id', 'version', 'created_at'])
        .executeTakeFirstOrThrow();
      directory.invalidate();
      return { id: row.id, tenantId: input.tenantId, name: input.name, version: row.version, document };
    },

    async listPolicies(tenantId: string) {
      const rows = await db
        .selectFrom('iam.policies')
        .selectAll()
        .where('tenant_id', '=', tenantId)
        .orderBy('name')
        .orderBy('version', 'desc')
        .execute();
      return rows.map((r) => ({
        id: r.id,
        tenantId: r.tenant_id,
        name: r.name,
        version: r.version,
        document: r.document as PolicyDocument,
        createdAt: r.created_at,
      }));
    },

    /** The person's answer to a confirmation; only the person it names may decide it. */
    async decideConfirmation(input: {
      confirmationId: string;
      personIdentityId: string;
      decision: 'approved' | 'denied';
    }) {
      const row = await db
        .updateTable('iam.confirmations')
        .set({ state: input.decision, decided_at: sql<Date>`compute_now()` as never })
        .where('id', '=', input.confirmationId)
        .where('person_identity_id', '=', input.personIdentityId)
        .where('state', '=', 'pending')
        .where(sql<boolean>`expires_at > compute_now()`)
        .returningAll()
        .executeTakeFirst();
      if (!row) {
        const existing = await db
          .selectFrom('iam.confirmations')
          .selectAll()
          .where('id', '=', input.confirmationId)
          .executeTakeFirst();
        if (!existing || existing.person_identity_id !== input.personIdentityId) {
          throw new ComputeError('NOT_FOUND', `confirmation ${input.confirmationId} does not exist`);
        }
        throw new ComputeError(
          'INVALID_STATE',
          `confirmation ${input.confirmationId} is ${existing.state === 'pending' ? 'expired' : existing.state}`,
        );
      }
      return { id: row.id, state: row.state, resourceId: row.resource_id, action: row.action };
    },

    async listConfirmations(personIdentityId: string) {
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
    },

    async setBudget(input: { tenantId: string; meter?: string; limit: number }) {
      await requireTenant(input.tenantId);
      await db
        .insertInto('iam.budgets')
        .values({ tenant_id: input.tenantId, meter: input.meter ?? '*', limit_amount: input.limit })
        .onConflict((oc) =>
          oc.columns(['tenant_id', 'meter']).doUpdateSet({
            limit_amount: input.limit,
            updated_at: sql<Date>`compute_now()` as never,
          }),
        )
        .execute();
      return { tenantId: input.tenantId, meter: input.meter ?? '*', limit: input.limit };
    },

    async setFeature(input: { tenantId: string; feature: string; enabled: boolean }) {
      await requireTenant(input.tenantId);
      await db
        .insertInto('iam.feature_flags')
        .values({ tenant_id: input.tenantId, feature: input.feature, enabled: input.enabled })
        .onConflict((oc) => oc.columns(['tenant_id', 'feature']).doUpdateSet({ enabled: input.enabled }))
        .execute();
    },
  };
}
