import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { preparedMarker } from '../pool.ts';

/**
 * Join tokens `bcjt_<id>.<secret>`: one pool, a time to live, a number of uses (default 1), shown
 * once and stored as the SHA-256 of the secret.
 */

const tokenPattern = /^bcjt_([0-9a-z]{26})\.([A-Za-z0-9_-]{43})$/;

function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

export interface JoinTokenView {
  id: string;
  poolId: string;
  expiresAt: Date;
  /** Whether `expiresAt` has passed by the database's clock (`compute_now()`). */
  expired: boolean;
  maxUses: number;
  uses: number;
  revokedAt: Date | null;
  createdBy: string | null;
  createdAt: Date;
}

/** Creates a token and returns it in full; this is the only time the secret exists in the clear. */
export async function createJoinToken(
  db: Db,
  input: { poolId: string; ttlSeconds: number; maxUses?: number; createdBy?: string | null },
): Promise<{ token: string; id: string; expiresAt: Date; maxUses: number }> {
  const id = newId('jt');
  const secret = randomBytes(32).toString('base64url');
  const row = await db
    .insertInto('join_tokens')
    .values({
      id,
      pool_id: input.poolId,
      secret_hash: hashSecret(secret),
      expires_at: sql<Date>`compute_now() + make_interval(secs => ${input.ttlSeconds})`,
      max_uses: input.maxUses ?? 1,
      created_by: input.createdBy ?? null,
    })
    .returning(['expires_at', 'max_uses'])
    .executeTakeFirstOrThrow();
  return { token: `bcjt_${id.slice(3)}.${secret}`, id, expiresAt: row.expires_at, maxUses: row.max_uses };
}

const refused = (why: string) =>
  new ComputeError('UNAUTHENTICATED', 'the join token is invalid, expired, revoked or used up', {
    reason: why,
  });

/** What a Join reads first, in one statement: its token, the token's pool and the clock. */
export interface JoinStart {
  tokenId: string;
  poolId: string;
  /** The pool, or null when the token names a missing one. */
  pool: { id: string; siteId: string; archived: boolean } | null;
  /** Whether every use of the token is spent (only a repeated Join may go on: `findNodeJoinedWithKey`). */
  usedUp: boolean;
  /** `compute_now()` of the transaction. */
  now: Date;
}

/**
 * The first statement of a Join, in its transaction: takes a transaction-scoped advisory lock on
 * the CSR's key (`keyId`), so Joins of one key (a retry whose first attempt's reply was lost, a
 * duplicate in flight) run one after the other and a later one sees what an earlier one
 * committed, and reads the token (unlocked), its pool and the clock in the same round trip.
 * UNAUTHENTICATED (one answer for all) for a token that is malformed, unknown, revoked or expired;
 * a used-up token is answered with `usedUp` (the caller refuses it unless the Join is a repeat).
 */
export async function beginJoin(
  trx: Transaction<Database>,
  token: string,
  keyId: string,
): Promise<JoinStart> {
  const match = tokenPattern.exec(token.trim());
  if (!match) throw refused('malformed');
  const id = `jt_${match[1]}`;
  const { rows } = await sql<{
    locked: unknown;
    now: Date;
    pool_id: string | null;
    secret_hash: string | null;
    max_uses: number | null;
    uses: number | null;
    revoked: boolean | null;
    expired: boolean | null;
    site_id: string | null;
    archived: boolean | null;
    pool_found: boolean;
  }>`${sql.raw(preparedMarker)}
    SELECT pg_advisory_xact_lock(hashtextextended(${`join-key:${keyId}`}, 0)) AS locked,
      compute_now() AS now, t.pool_id, t.secret_hash, t.max_uses, t.uses,
      t.revoked_at IS NOT NULL AS revoked, t.expires_at <= compute_now() AS expired,
      p.site_id, p.archived_at IS NOT NULL AS archived, p.id IS NOT NULL AS pool_found
    FROM (SELECT 1) AS one
      LEFT JOIN join_tokens t ON t.id = ${id}
      LEFT JOIN pools p ON p.id = t.pool_id`.execute(trx);
  const row = rows[0];
  if (!row?.secret_hash || !row.pool_id) throw refused('unknown');
  const given = Buffer.from(hashSecret(match[2]!), 'hex');
  const stored = Buffer.from(row.secret_hash, 'hex');
  if (given.length !== stored.length || !timingSafeEqual(given, stored)) throw refused('secret');
  if (row.revoked) throw refused('revoked');
  if (row.expired) throw refused('expired');
  return {
    tokenId: id,
    poolId: row.pool_id,
    pool: row.pool_found ? { id: row.pool_id, siteId: row.site_id!, archived: row.archived === true } : null,
    usedUp: (row.uses ?? 0) >= (row.max_uses ?? 0),
    now: row.now,
  };
}

/** The refusal of a token whose every use is spent (after `beginJoin` answered `usedUp`). */
export function joinTokenUsedUp(): ComputeError {
  return refused('used');
}

/**
 * Records that `nodeId` joined with a checked token, spending one use of it when the caller's
 * transaction commits (the deferred trigger of migrations/2026-12-06T00-join-token-uses.ts): the
 * commit fails, and nothing of the transaction stays, when the token was revoked, expired or used
 * up meanwhile; run the caller's commit through `refusedAtCommit`. The token's row is locked only
 * while the commit runs, so concurrent Joins with one token do not wait on each other's round trips.
 */
export async function spendJoinToken(
  trx: Transaction<Database>,
  use: { tokenId: string; nodeId: string },
): Promise<void> {
  await trx.insertInto('join_token_uses').values({ token_id: use.tokenId, node_id: use.nodeId }).execute();
}

/** A commit that failed because its token could not be spent (see spendJoinToken) as the refusal. */
export function refusedAtCommit(error: unknown): unknown {
  return (error as { code?: unknown } | null)?.code === 'BC003' ? refused('used') : error;
}

function view(row: {
  id: string;
  pool_id: string;
  expires_at: Date;
  expired: boolean;
  max_uses: number;
  uses: number;
  revoked_at: Date | null;
  created_by: string | null;
  created_at: Date;
}): JoinTokenView {
  return {
    id: row.id,
    poolId: row.pool_id,
    expiresAt: row.expires_at,
    expired: row.expired,
    maxUses: row.max_uses,
    uses: row.uses,
    revokedAt: row.revoked_at,
    createdBy: row.created_by,
    createdAt: row.created_at,
  };
}

const columns = [
  'id',
  'pool_id',
  'expires_at',
  sql<boolean>`expires_at <= compute_now()`.as('expired'),
  'max_uses',
  'uses',
  'revoked_at',
  'created_by',
  'created_at',
] as const;

export async function listJoinTokens(
  db: Db,
  filter: { poolIds?: readonly string[]; limit: number; cursor?: string },
): Promise<JoinTokenView[]> {
  let query = db.selectFrom('join_tokens').select(columns).orderBy('id', 'desc').limit(filter.limit);
  if (filter.poolIds) {
    if (filter.poolIds.length === 0) return [];
    query = query.where('pool_id', 'in', filter.poolIds);
  }
  if (filter.cursor) query = query.where('id', '<', filter.cursor);
  return (await query.execute()).map(view);
}

export async function findJoinToken(db: Db, id: string): Promise<JoinTokenView | null> {
  const row = await db.selectFrom('join_tokens').select(columns).where('id', '=', id).executeTakeFirst();
  return row ? view(row) : null;
}

/** Revokes a token; revoking twice keeps the first time. */
export async function revokeJoinToken(db: Db, id: string): Promise<JoinTokenView | null> {
  const row = await db
    .updateTable('join_tokens')
    .set({ revoked_at: sql<Date>`COALESCE(revoked_at, compute_now())` })
    .where('id', '=', id)
    .returning(columns)
    .executeTakeFirst();
  return row ? view(row) : null;
}
