import { sql } from 'kysely';
import type { IamDb } from '../../core/iam-database.ts';
import type { IdentityKind, TokenInfo } from '../../core/iam-port.ts';
import { notFoundOnMissingReference } from './iam-db.ts';

/** A token row as callers see it: never its secret hash. */
function toTokenInfo(row: {
  id: string;
  identity_id: string;
  name: string;
  expires_at: Date | null;
  revoked_at: Date | null;
  last_used_at: Date | null;
  created_at: Date;
}): TokenInfo {
  return {
    id: row.id,
    identityId: row.identity_id,
    name: row.name,
    expiresAt: row.expires_at,
    revokedAt: row.revoked_at,
    lastUsedAt: row.last_used_at,
    createdAt: row.created_at,
  };
}

/** Who a token stands for, as authentication reads it. */
export interface TokenHolder {
  tokenId: string;
  identityId: string;
  tenantId: string;
  kind: IdentityKind;
  /** Set when the token acts under a standing delegation (an agent for its person). */
  delegation: { delegationId: string; personIdentityId: string } | null;
}

/**
 * The holder of the token with this secret hash, when the token is neither revoked nor expired (by
 * `compute_now()`), its identity is not disabled and, for a token minted under a delegation, that
 * delegation is not revoked; undefined otherwise. A delegated token never reads as a direct one.
 */
export async function findTokenHolder(db: IamDb, secretHash: string): Promise<TokenHolder | undefined> {
  const row = await db
    .selectFrom('iam.tokens as t')
    .innerJoin('iam.identities as i', 'i.id', 't.identity_id')
    .leftJoin('iam.delegations as d', 'd.id', 't.delegation_id')
    .where('t.secret_hash', '=', secretHash)
    .where('t.revoked_at', 'is', null)
    .where('i.disabled_at', 'is', null)
    .where(sql<boolean>`(t.expires_at IS NULL OR t.expires_at > compute_now())`)
    .where(sql<boolean>`(t.delegation_id IS NULL OR (d.id IS NOT NULL AND d.revoked_at IS NULL))`)
    .select([
      't.id as token_id',
      'i.id as identity_id',
      'i.tenant_id',
      'i.kind',
      'd.id as delegation_id',
      'd.person_identity_id',
    ])
    .executeTakeFirst();
  if (!row) return undefined;
  return {
    tokenId: row.token_id,
    identityId: row.identity_id,
    tenantId: row.tenant_id,
    kind: row.kind,
    delegation:
      row.delegation_id && row.person_identity_id
        ? { delegationId: row.delegation_id, personIdentityId: row.person_identity_id }
        : null,
  };
}

/** Records a token's use; written at most once a minute per token, so a burst costs one write. */
export async function touchTokenLastUsed(db: IamDb, tokenId: string): Promise<void> {
  await db
    .updateTable('iam.tokens')
    .set({ last_used_at: sql<Date>`compute_now()` })
    .where('id', '=', tokenId)
    .where(sql<boolean>`(last_used_at IS NULL OR last_used_at < compute_now() - interval '60 seconds')`)
    .execute();
}

/**
 * Inserts a token (its secret only as a hash); it expires `expiresInSeconds` after `compute_now()`.
 * NOT_FOUND when the identity (or the delegation) does not exist.
 */
export async function insertToken(
  db: IamDb,
  token: {
    id: string;
    identityId: string;
    name: string;
    secretHash: string;
    delegationId: string | null;
    expiresInSeconds?: number | undefined;
  },
): Promise<TokenInfo> {
  const insert = db
    .insertInto('iam.tokens')
    .values({
      id: token.id,
      identity_id: token.identityId,
      name: token.name,
      secret_hash: token.secretHash,
      delegation_id: token.delegationId,
      expires_at: token.expiresInSeconds
        ? sql<Date>`compute_now() + make_interval(secs => ${token.expiresInSeconds})`
        : null,
    })
    .returningAll();
  const row = await notFoundOnMissingReference(() => insert.executeTakeFirstOrThrow(), {
    identity_id: `identityId: identity ${token.identityId} does not exist`,
  });
  return toTokenInfo(row);
}

/** Tokens of an identity and/or of a tenant's identities, oldest first, without their secrets. */
export async function listTokens(
  db: IamDb,
  filter: { identityId?: string | undefined; tenantId?: string | undefined },
): Promise<TokenInfo[]> {
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
  return rows.map(toTokenInfo);
}

/** Revokes a token at `compute_now()`; idempotent (keeps the first revocation). Undefined when it does not exist. */
export async function revokeToken(
  db: IamDb,
  tokenId: string,
): Promise<{ id: string; revokedAt: Date } | undefined> {
  const row = await db
    .updateTable('iam.tokens')
    .set({ revoked_at: sql<Date>`COALESCE(revoked_at, compute_now())` })
    .where('id', '=', tokenId)
    .returning(['id', 'revoked_at'])
    .executeTakeFirst();
  return row?.revoked_at ? { id: row.id, revokedAt: row.revoked_at } : undefined;
}
