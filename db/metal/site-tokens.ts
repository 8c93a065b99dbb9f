import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';

/**
 * Site join tokens `bcst_<id>.<secret>`: a site agent (`bcd site`) joins its site with one. One
 * site, a time to live, a number of uses (one per agent: the boot server and its standbys), shown
 * once and stored as the SHA-256 of the secret.
 */

const tokenPattern = /^bcst_([0-9a-z]{26})\.([A-Za-z0-9_-]{43})$/;

/** Whether `token` has the shape of a site join token (the gateway routes Join by it). */
export function isSiteJoinToken(token: string): boolean {
  return token.trim().startsWith('bcst_');
}

function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

export interface SiteJoinTokenView {
  id: string;
  siteId: string;
  expiresAt: Date;
  maxUses: number;
  uses: number;
  revokedAt: Date | null;
  createdAt: Date;
}

/** Creates a site token and returns it in full: the only time its secret exists in the clear. */
export async function createSiteJoinToken(
  db: Db,
  input: { siteId: string; ttlSeconds: number; maxUses: number; createdBy: string | null },
): Promise<{ token: string; view: SiteJoinTokenView }> {
  const id = newId('st');
  const secret = randomBytes(32).toString('base64url');
  const row = await db
    .insertInto('site_join_tokens')
    .values({
      id,
      site_id: input.siteId,
      secret_hash: hashSecret(secret),
      expires_at: sql<Date>`compute_now() + make_interval(secs => ${input.ttlSeconds})`,
      max_uses: input.maxUses,
      created_by: input.createdBy,
    })
    .returning(['id', 'site_id', 'expires_at', 'max_uses', 'uses', 'revoked_at', 'created_at'])
    .executeTakeFirstOrThrow();
  return {
    token: `bcst_${id.slice(3)}.${secret}`,
    view: {
      id: row.id,
      siteId: row.site_id,
      expiresAt: row.expires_at,
      maxUses: row.max_uses,
      uses: row.uses,
      revokedAt: row.revoked_at,
      createdAt: row.created_at,
    },
  };
}

const refused = (why: string) =>
  new ComputeError('UNAUTHENTICATED', 'the site join token is invalid, expired, revoked or used up', {
    reason: why,
  });

/**
 * Checks a site token and spends one use of it, atomically, in the caller's transaction; answers
 * its site. UNAUTHENTICATED (one answer for every reason, so it tells nothing) for a token that is
 * malformed, unknown, revoked, expired or used up.
 */
export async function consumeSiteJoinToken(
  trx: Transaction<Database>,
  token: string,
): Promise<{ tokenId: string; siteId: string }> {
  const match = tokenPattern.exec(token.trim());
  if (!match) throw refused('malformed');
  const id = `st_${match[1]}`;
  const row = await trx
    .selectFrom('site_join_tokens')
    .where('id', '=', id)
    .select(['site_id', 'secret_hash'])
    .executeTakeFirst();
  if (!row) throw refused('unknown');
  const given = Buffer.from(hashSecret(match[2]!), 'hex');
  const stored = Buffer.from(row.secret_hash, 'hex');
  if (given.length !== stored.length || !timingSafeEqual(given, stored)) throw refused('secret');
  const spent = await trx
    .updateTable('site_join_tokens')
    .set({ uses: sql<number>`uses + 1` })
    .where('id', '=', id)
    .where('revoked_at', 'is', null)
    .where(sql<boolean>`expires_at > compute_now()`)
    .where(sql<boolean>`uses < max_uses`)
    .executeTakeFirst();
  if (Number(spent.numUpdatedRows) === 0) throw refused('revoked, expired or used');
  return { tokenId: id, siteId: row.site_id };
}
