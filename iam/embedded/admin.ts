import { createHash, randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type { IdentityKind } from '../port.ts';
import { maxConfirmationMs } from './decide.ts';
import type { Directory, IamDb } from './directory.ts';
import { type PolicyDocument, policyDocumentSchema } from './policy.ts';

export const tenantIdPattern = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

function slug(name: string): string {
  return (
    name
      .toLowerCase()
      .replace(/[^a-z0-9_-]+/g, '-')
      .replace(/^-+|-+$/g, '')
      .slice(0, 63) || 'tenant'
  );
}

function isUniqueViolation(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: string }).code === '23505';
}

export interface TenantInfo {
  id: string;
  name: string;
  parentId: string | null;
  createdAt: Date;
}

export interface IdentityInfo {
  id: string;
  tenantId: string;
  kind: IdentityKind;
  name: string;
  email: string | null;
  delegationId: string | null;
  createdAt: Date;
}

export interface TokenInfo {
  id: string;
  identityId: string;
  name: string;
  expiresAt: Date | null;
  revokedAt: Date | null;
  lastUsedAt: Date | null;
  createdAt: Date;
}

/**
 * IAM's administration: tenants, identities, tokens, roles and bindings, policies, confirmations
 * and budgets. Every write drops the decision cache so the next decision sees it.
 */
export function createIamAdmin(db: IamDb, directory: Directory) {
  async function requireTenant(tenantId: string) {
    const tenant = await directory.tenant(tenantId);
    if (!tenant) throw new ComputeError('NOT_FOUND', `tenant ${tenantId} does not exist`);
    return tenant;
  }

  async function requireIdentity(identityId: string) {
    const row = await db
      .selectFrom('iam.identities')
      .selectAll()
      .where('id', '=', identityId)
      .executeTakeFirst();
    if (!row) throw new ComputeError('NOT_FOUND', `identity ${identityId} does not exist`);
    return row;
  }

  return {
    /** Creates a tenant under `parentId` (default: the root). The first tenant ever is the root. */
    async createTenant(input: { id?: string; name: string; parentId?: string | null }): Promise<TenantInfo> {
      const id = input.id ?? slug(input.name);
      if (!tenantIdPattern.test(id)) {
        throw new ComputeError(
          'INVALID_INPUT',
          `id: a tenant id is 1 to 63 lower-case letters, digits, '-' or '_', got '${id}'`,
        );
      }
      const root = await directory.rootTenantId();
      const parentId = input.parentId === undefined ? root : input.parentId;
      if (parentId) await requireTenant(parentId);
      if (!parentId && root) {
        throw new ComputeError('CONFLICT', `the root tenant already exists (${root})`, { tenantId: root });
      }
      try {
        const row = await db
          .insertInto('iam.tenants')
          .values({ id, name: input.name, parent_id: parentId })
          .returningAll()
          .executeTakeFirstOrThrow();
        directory.invalidate();
        return { id: row.id, name: row.name, parentId: row.parent_id, createdAt: row.created_at };
      } catch (error) {
        if (isUniqueViolation(error)) {
          throw new ComputeError('CONFLICT', `tenant ${id} already exists`, { tenantId: id });
        }
        throw error;
      }
    },

    async listTenants(): Promise<TenantInfo[]> {
      const rows = await db.selectFrom('iam.tenants').selectAll().orderBy('created_at').execute();
      return rows.map((r) => ({ id: r.id, name: r.name, parentId: r.parent_id, createdAt: r.created_at }));
    },

    async getTenant(tenantId: string) {
      return directory.tenant(tenantId);
    },

    rootTenantId: () => directory.rootTenantId(),

    /** An identity; an agent with `personIdentityId` gets a delegation from that person. */
    async createIdentity(input: {
      tenantId: string;
      kind: IdentityKind;
      name: string;
      email?: string;
      personIdentityId?: string;
      confirmActions?: string[];
    }): Promise<IdentityInfo> {
      await requireTenant(input.tenantId);
      if (input.personIdentityId && input.kind !== 'agent') {
        throw new ComputeError('INVALID_INPUT', 'personIdentityId: only an agent acts for a person');
      }
      if (input.personIdentityId) {
        const person = await requireIdentity(input.personIdentityId);
        if (person.kind !== 'person' || person.tenant_id !== input.tenantId) {
          throw new ComputeError(
            'INVALID_INPUT',
            `personIdentityId: ${input.personIdentityId} is not a person of tenant ${input.tenantId}`,
          );
        }
      }
      const id = newId('idn');
      let delegationId: string | null = null;
      try {
        await db.transaction().execute(async (trx) => {
          await trx
            .insertInto('iam.identities')
            .values({
              id,
              tenant_id: input.tenantId,
              kind: input.kind,
              name: input.name,
              email: input.email ?? null,
            })
            .execute();
          if (input.personIdentityId) {
            delegationId = `dlg_${id.slice(4)}`;
            await trx
              .insertInto('iam.delegations')
              .values({
                id: delegationId,
                agent_identity_id: id,
                person_identity_id: input.personIdentityId,
                confirm_actions: input.confirmActions ?? [],
              })
              .execute();
          }
        });
      } catch (error) {
        if (isUniqueViolation(error)) {
          throw new ComputeError(
            'CONFLICT',
            `tenant ${input.tenantId} already has an identity named ${input.name}`,
          );
        }
        throw error;
      }
      const row = await requireIdentity(id);
      return {
        id,
        tenantId: row.tenant_id,
        kind: row.kind,
        name: row.name,
        email: row.email,
        delegationId,
        createdAt: row.created_at,
      };
    },

    async listIdentities(tenantId: string): Promise<IdentityInfo[]> {
      const rows = await db
        .selectFrom('iam.identities as i')
        .leftJoin('iam.delegations as d', (j) =>
          j.onRef('d.agent_identity_id', '=', 'i.id').on('d.revoked_at', 'is', null),
        )
        .where('i.tenant_id', '=', tenantId)
        .select([
          'i.id',
          'i.tenant_id',
          'i.kind',
          'i.name',
          'i.email',
          'i.created_at',
          'd.id as delegation_id',
        ])
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
    },

    /**
     * Mints an API token. The secret is returned here once and stored only as its SHA-256; an
     * agent's token acts under its delegation (a delegated session).
     */
    async createToken(input: {
      identityId: string;
      name?: string;
      expiresInSeconds?: number;
    }): Promise<TokenInfo & { token: string }> {
      const identity = await requireIdentity(input.identityId);
      const delegation =
        identity.kind === 'agent'
          ? await db
              .selectFrom('iam.delegations')
              .select('id')
              .where('agent_identity_id', '=', identity.id)
              .where('revoked_at', 'is', null)
              .executeTakeFirst()
          : undefined;
      const id = newId('tok');
      const token = `bct_${randomBytes(32).toString('base64url')}`;
      const row = await db
        .insertInto('iam.tokens')
        .values({
          id,
          identity_id: identity.id,
          name: input.name ?? '',
          secret_hash: hashToken(token),
          delegation_id: delegation?.id ?? null,
          expires_at: input.expiresInSeconds
            ? sql<Date>`compute_now() + make_interval(secs => ${input.expiresInSeconds})`
            : null,
        } as never)
        .returningAll()
        .executeTakeFirstOrThrow();
      return {
        id,
        token,
        identityId: row.identity_id,
        name: row.name,
        expiresAt: row.expires_at,
        revokedAt: null,
        lastUsedAt: null,
        createdAt: row.created_at,
      };
    },

    async listTokens(filter: { identityId?: string; tenantId?: string }): Promise<TokenInfo[]> {
      let query = db
        .selectFrom('iam.tokens as t')
        .innerJoin('iam.identities as i', 'i.id', 't.identity_id')
        .select([
          't.id',
          't.identity_id',
          't.name',
          't.expires_at',
          't.revoked_at',
          't.last_used_at',
          't.created_at',
        ]);
      if (filter.identityId) query = query.where('t.identity_id', '=', filter.identityId);
      if (filter.tenantId) query = query.where('i.tenant_id', '=', filter.tenantId);
      const rows = await query.orderBy('t.created_at').execute();
      return rows.map((r) => ({
        id: r.id,
        identityId: r.identity_id,
        name: r.name,
        expiresAt: r.expires_at,
        revokedAt: r.revoked_at,
        lastUsedAt: r.last_used_at,
        createdAt: r.created_at,
      }));
    },

    /** Revokes a token; idempotent. A cached authentication lapses within its 30-second TTL. */
    async revokeToken(tokenId: string): Promise<{ id: string; revokedAt: Date }> {
      const row = await db
        .updateTable('iam.tokens')
        .set({ revoked_at: sql<Date>`COALESCE(revoked_at, compute_now())` as never })
        .where('id', '=', tokenId)
        .returning(['id', 'revoked_at'])
        .executeTakeFirst();
      if (!row) throw new ComputeError('NOT_FOUND', `token ${tokenId} does not exist`);
      return { id: row.id, revokedAt: row.revoked_at! };
    },

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

export type IamAdmin = ReturnType<typeof createIamAdmin>;
export { maxConfirmationMs };
