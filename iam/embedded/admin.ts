import { createHash, randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { IdentityKind } from '../../core/iam-port.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { createAccessAdmin } from './admin-access.ts';
import { maxConfirmationMs } from './decide.ts';
import type { Directory, IamDb } from './directory.ts';
import { createLookups } from './lookups.ts';

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
  const { requireTenant, requireIdentity } = createLookups(db, directory);

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

    ...createAccessAdmin(db, directory),
  };
}

export type IamAdmin = ReturnType<typeof createIamAdmin>;
export { maxConfirmationMs };
