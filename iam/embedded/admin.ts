import { createHash, randomBytes } from 'node:crypto';
import type { IamDb } from '../../core/iam-database.ts';
import { type IamAdminPort, tenantIdPattern } from '../../core/iam-port.ts';
import {
  findAgentDelegation,
  insertIdentity,
  listIdentities,
  revokeDelegation,
} from '../../db/iam/identities.ts';
import { findRoleToBind, insertRoleBinding } from '../../db/iam/roles.ts';
import { insertTenant, listTenants } from '../../db/iam/tenants.ts';
import { insertToken, listTokens, revokeToken } from '../../db/iam/tokens.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { createAccessAdmin } from './admin-access.ts';
import type { Directory } from './directory.ts';
import { createLookups } from './lookups.ts';

/** Tokens are stored as their SHA-256 only. */
export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

function slug(name: string): string {
  return (
    name
      .toLowerCase()
      .replace(/[^a-z0-9_-]+/g, '-')
      // A tenant id starts with a letter or digit (tenantIdPattern), whatever the name starts with.
      .replace(/^[-_]+|[-_]+$/g, '')
      .slice(0, 63) || 'tenant'
  );
}

/**
 * IAM's administration: tenants, identities and tokens here, access (roles, policies,
 * confirmations, budgets, features) in admin-access.ts. Every write drops the decision cache so the
 * next decision sees it.
 */
export function createIamAdmin(db: IamDb, directory: Directory): IamAdminPort {
  const { requireTenant, requireIdentity } = createLookups(db, directory);

  return {
    async createTenant(input) {
      const id = input.id ?? slug(input.name);
      if (!tenantIdPattern.test(id)) {
        throw new ComputeError(
          'INVALID_INPUT',
          `id: a tenant id is 1 to 63 lower-case letters, digits, '-' or '_', got '${id}'`,
        );
      }
      const root = await directory.rootTenantId();
      const parentId = input.parentId === undefined ? root : input.parentId;
      if (parentId && !(await directory.tenant(parentId))) {
        throw new ComputeError('NOT_FOUND', `parentId: tenant ${parentId} does not exist`);
      }
      if (!parentId && root) {
        throw new ComputeError('CONFLICT', `the root tenant already exists (${root})`, { tenantId: root });
      }
      const tenant = await insertTenant(db, { id, name: input.name, parentId });
      directory.invalidate();
      return tenant;
    },

    listTenants: () => listTenants(db),

    getTenant: (tenantId) => directory.tenant(tenantId),

    rootTenantId: () => directory.rootTenantId(),

    async createIdentity(input) {
      await requireTenant(input.tenantId);
      if (input.personIdentityId && input.kind !== 'agent') {
        throw new ComputeError('INVALID_INPUT', 'personIdentityId: only an agent acts for a person');
      }
      if (input.personIdentityId) {
        const person = await requireIdentity(input.personIdentityId);
        if (person.tenant_id !== input.tenantId) {
          throw new ComputeError(
            'NOT_FOUND',
            `personIdentityId: no identity ${input.personIdentityId} in tenant ${input.tenantId}`,
          );
        }
        if (person.kind !== 'person') {
          throw new ComputeError(
            'INVALID_INPUT',
            `personIdentityId: ${input.personIdentityId} is a ${person.kind}, not a person: an agent acts for a person`,
          );
        }
      }
      // Every role is resolved first, so a role that does not exist leaves no identity behind.
      const roles: Array<{ id: string; name: string }> = [];
      for (const role of input.roles ?? []) {
        const found = await findRoleToBind(db, role, input.tenantId);
        if (!found) {
          throw new ComputeError(
            'NOT_FOUND',
            `roles: role ${role} does not exist for tenant ${input.tenantId}`,
          );
        }
        roles.push(found);
      }
      const id = newId('idn');
      const delegation = input.personIdentityId
        ? {
            id: `dlg_${id.slice(4)}`,
            personIdentityId: input.personIdentityId,
            confirmActions: input.confirmActions ?? [],
          }
        : null;
      await db.transaction().execute(async (trx) => {
        await insertIdentity(
          trx,
          { id, tenantId: input.tenantId, kind: input.kind, name: input.name, email: input.email ?? null },
          delegation,
        );
        for (const role of roles) {
          await insertRoleBinding(trx, { identityId: id, roleId: role.id, tenantId: input.tenantId });
        }
      });
      if (roles.length > 0) directory.invalidate();
      const row = await requireIdentity(id);
      return {
        id,
        tenantId: row.tenant_id,
        kind: row.kind,
        name: row.name,
        email: row.email,
        delegationId: delegation?.id ?? null,
        createdAt: row.created_at,
      };
    },

    listIdentities: (tenantId) => listIdentities(db, tenantId),

    /**
     * Mints an API token. The secret is returned here once and stored only as its SHA-256; an
     * agent's token acts under its delegation (a delegated session). INVALID_STATE for an agent
     * whose delegation was revoked: it never gets a direct session instead.
     */
    async createToken(input) {
      const identity = await requireIdentity(input.identityId);
      const delegation = identity.kind === 'agent' ? await findAgentDelegation(db, identity.id) : null;
      if (delegation?.revoked) {
        throw new ComputeError(
          'INVALID_STATE',
          `identityId: the delegation agent ${identity.id} acted under (${delegation.id}) was revoked; create a new agent for the person instead`,
        );
      }
      const delegationId = delegation?.id ?? null;
      const token = `bct_${randomBytes(32).toString('base64url')}`;
      const info = await insertToken(db, {
        id: newId('tok'),
        identityId: identity.id,
        name: input.name ?? '',
        secretHash: hashToken(token),
        delegationId,
        expiresInSeconds: input.expiresInSeconds,
      });
      return { ...info, token };
    },

    listTokens: (filter) => listTokens(db, filter),

    /** Revokes a token; idempotent. A cached authentication lapses within its 30-second TTL. */
    async revokeToken(tokenId) {
      const revoked = await revokeToken(db, tokenId);
      if (!revoked) throw new ComputeError('NOT_FOUND', `token ${tokenId} does not exist`);
      return revoked;
    },

    /** Revokes a delegation; idempotent. The agent's tokens stop authenticating at once in this process. */
    async revokeDelegation(delegationId) {
      const revoked = await revokeDelegation(db, delegationId);
      if (!revoked) throw new ComputeError('NOT_FOUND', `delegation ${delegationId} does not exist`);
      directory.invalidate();
      return revoked;
    },

    ...createAccessAdmin(db, directory),
  };
}
