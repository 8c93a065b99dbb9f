import type { IamDb } from '../../core/iam-database.ts';
import { policyDocumentSchema } from '../../core/iam-policy.ts';
import type { IamAdminPort } from '../../core/iam-port.ts';
import { upsertBudget } from '../../db/iam/budgets.ts';
import {
  decidePendingConfirmation,
  findConfirmationState,
  listConfirmationsFor,
} from '../../db/iam/confirmations.ts';
import { upsertFeatureFlag } from '../../db/iam/features.ts';
import { insertPolicyVersion, listPolicyVersions } from '../../db/iam/policies.ts';
import { findRoleToBind, insertRole, insertRoleBinding, listRoles } from '../../db/iam/roles.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type { Directory } from './directory.ts';
import { createLookups } from './lookups.ts';

type AccessAdmin = Pick<
  IamAdminPort,
  | 'createRole'
  | 'listRoles'
  | 'bindRole'
  | 'applyPolicy'
  | 'listPolicies'
  | 'decideConfirmation'
  | 'listConfirmations'
  | 'setBudget'
  | 'setFeature'
>;

/**
 * IAM's access administration: roles and their bindings, versioned policies, the person's answer
 * to a confirmation, budgets and feature flags. Every write drops the decision cache.
 */
export function createAccessAdmin(db: IamDb, directory: Directory): AccessAdmin {
  const { requireTenant, requireIdentity } = createLookups(db, directory);

  return {
    async createRole(input) {
      await requireTenant(input.tenantId);
      const id = newId('role');
      await insertRole(db, { id, tenantId: input.tenantId, name: input.name, actions: input.actions });
      directory.invalidate();
      return { id, tenantId: input.tenantId, name: input.name, actions: input.actions };
    },

    listRoles: (tenantId) => listRoles(db, tenantId),

    async bindRole(input) {
      const identity = await requireIdentity(input.identityId);
      const tenantId = input.tenantId ?? identity.tenant_id;
      await requireTenant(tenantId);
      const role = await findRoleToBind(db, input.role, tenantId);
      if (!role)
        throw new ComputeError('NOT_FOUND', `role ${input.role} does not exist for tenant ${tenantId}`);
      await insertRoleBinding(db, { identityId: identity.id, roleId: role.id, tenantId });
      directory.invalidate();
      return { identityId: identity.id, roleId: role.id, roleName: role.name, tenantId };
    },

    async applyPolicy(input) {
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
      const policy = await insertPolicyVersion(db, {
        id: newId('pol'),
        tenantId: input.tenantId,
        name: input.name,
        document: parsed.data,
        createdBy: input.createdBy ?? null,
      });
      directory.invalidate();
      return policy;
    },

    listPolicies: (tenantId) => listPolicyVersions(db, tenantId),

    async decideConfirmation(input) {
      const decided = await decidePendingConfirmation(db, input);
      if (decided) return decided;
      const existing = await findConfirmationState(db, input.confirmationId);
      if (!existing || existing.personIdentityId !== input.personIdentityId) {
        throw new ComputeError('NOT_FOUND', `confirmation ${input.confirmationId} does not exist`);
      }
      throw new ComputeError(
        'INVALID_STATE',
        `confirmation ${input.confirmationId} is ${existing.state === 'pending' ? 'expired' : existing.state}`,
      );
    },

    listConfirmations: (personIdentityId) => listConfirmationsFor(db, personIdentityId),

    async setBudget(input) {
      await requireTenant(input.tenantId);
      const budget = { tenantId: input.tenantId, meter: input.meter ?? '*', limit: input.limit };
      await upsertBudget(db, budget);
      return budget;
    },

    async setFeature(input) {
      await requireTenant(input.tenantId);
      await upsertFeatureFlag(db, input);
    },
  };
}
